"""Which kv_slots entries a CUDA graph's lane row still holds (the bookkeeping runs on the CPU)."""

from __future__ import annotations

from lanes.graphs import _Graph


def test_valid_slots_follow_the_blocks():
    g = _Graph(lanes=2, tokens=1, max_ctx=64, group=2, device="cpu")
    assert g.valid_slots(0, [3, 4], 16) == 0  # never written
    g.rows[0] = ([3, 4], 20)
    assert g.valid_slots(0, [3, 4], 16) == 20  # same blocks
    assert g.valid_slots(0, [3, 4, 9], 16) == 20  # a block added after them
    assert g.valid_slots(0, [3], 16) == 16  # truncated: the first block still holds
    assert g.valid_slots(0, [3, 5], 16) == 16  # the second block was replaced
    assert g.valid_slots(0, [6, 4], 16) == 0  # another lane, or preempted and back elsewhere
    assert g.valid_slots(1, [3, 4], 16) == 0  # rows are separate
