"""Block pool and block tables: exact ids, refcounts, integrity under random use."""

from __future__ import annotations

import random

import pytest

from lanes.cache import BlockPool, BlockTable, IntegrityError


def test_allocation_order_and_refcounts():
    pool = BlockPool(6)
    assert pool.allocate(2) == [0, 1]
    assert pool.allocate(3) == [2, 3, 4]
    pool.incref(3)
    assert [pool.refcount(b) for b in range(6)] == [1, 1, 1, 2, 1, 0]
    pool.release([1, 3])
    assert pool.refcount(1) == 0 and pool.refcount(3) == 1
    assert pool.num_free == 2
    # freed blocks queue behind the never-used one, in release order
    assert pool.allocate(2) == [5, 1]
    pool.release([3])
    assert pool.allocate(1) == [3]
    pool.check_integrity()


def test_misuse_raises():
    pool = BlockPool(2)
    with pytest.raises(IntegrityError):
        pool.allocate(3)
    (b,) = pool.allocate(1)
    pool.release([b])
    with pytest.raises(IntegrityError):
        pool.release([b])
    with pytest.raises(IntegrityError):
        pool.incref(b)


def test_integrity_check_catches_corruption():
    pool = BlockPool(4)
    pool.allocate(2)
    pool._free.append(0)  # a block both owned and free
    with pytest.raises(IntegrityError, match="both free and owned"):
        pool.check_integrity()
    pool = BlockPool(4)
    pool.allocate(1)
    pool._refcount[0] = 0  # leaked: neither free nor owned
    with pytest.raises(IntegrityError, match="!= total"):
        pool.check_integrity()


def test_random_alloc_free_keeps_integrity():
    rng = random.Random(0)
    pool = BlockPool(64)
    owners: list[list[int]] = []
    for _ in range(2000):
        r = rng.random()
        if r < 0.45 and pool.num_free:
            owners.append(pool.allocate(rng.randint(1, min(5, pool.num_free))))
        elif r < 0.6 and owners:
            shared = rng.choice(owners)
            for b in shared:
                pool.incref(b)
            owners.append(list(shared))
        elif owners:
            pool.release(owners.pop(rng.randrange(len(owners))))
        pool.check_integrity()
        expected_owned = {b for blocks in owners for b in blocks}
        assert pool.num_used == len(expected_owned)
    for blocks in owners:
        pool.release(blocks)
    pool.check_integrity()
    assert pool.num_free == 64


def test_block_table_slots():
    table = BlockTable(block_size=4)
    assert table.blocks_needed(9) == 3
    table.append([7, 2, 9])
    assert table.blocks_needed(9) == 0 and table.blocks_needed(13) == 1
    assert table.slots(0, 12) == [28, 29, 30, 31, 8, 9, 10, 11, 36, 37, 38, 39]
    assert table.slots(5, 7) == [9, 10]
    with pytest.raises(IndexError):
        table.slots(0, 13)
    assert table.clear() == [7, 2, 9] and table.capacity == 0


def test_block_table_slots_follow_truncate_and_regrowth():
    """The kept slot list tracks truncation (rejected drafts) and new blocks after it."""
    table = BlockTable(block_size=4)
    table.append([7, 2, 9])
    assert table.truncate(5) == [9]  # positions < 5 live in blocks 7 and 2
    with pytest.raises(IndexError):
        table.slots(0, 9)
    table.append([5])
    assert table.slots(0, 12) == [28, 29, 30, 31, 8, 9, 10, 11, 20, 21, 22, 23]
    table.clear()
    table.append([1])
    assert table.slots(0, 4) == [4, 5, 6, 7]
