"""Which kv_slots entries a CUDA graph's lane row still holds (the bookkeeping runs on the CPU)."""

from __future__ import annotations

from lanes.cache.block_table import BlockTable
from lanes.chain_graphs import _Chain
from lanes.graphs import _Graph
from lanes.rounds import Step


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


class _Lane:
    """What a chain step reads of a drafter's lane: its known tokens and its blocks."""

    def __init__(self, tokens: list[int], blocks: list[int]) -> None:
        self.tokens = tokens
        self.num_known = len(tokens)
        self.block_table = BlockTable(4)
        self.block_table.append(blocks)

    def token_ids(self, start: int, end: int) -> list[int]:
        return self.tokens[start:end]


def test_chain_layout_steps_lanes_and_padding():
    """A (4 lanes, 3 steps) chain over two lanes: one wants 3 steps from position 5, one wants
    1 from position 2 (its later steps repeat position 2 and write to the scratch slot), and two
    padding lanes; kv_slots entries are set once and only where they are not already right."""
    chain = _Chain(lanes=4, num_steps=3, max_ctx=8, device="cpu")
    a, b = _Lane(list(range(10, 16)), [7, 2]), _Lane([20, 21], [5])
    steps = [Step(a, 5, 6), Step(b, 2, 3, pending_row=0)]
    values = chain.layout(steps, [3, 1], scratch=99)
    ids, grid, rest = values[:4], values[4:52], values[52:]
    assert ids == [15, 0, 0, 0]  # lane b's token comes from the device (pending row)
    positions, slots, first, ctx = (grid[12 * k : 12 * k + 12] for k in range(4))
    assert positions == [5, 2, 0, 0, 6, 2, 1, 1, 7, 2, 2, 2]  # [step][lane]
    assert slots == [9, 22, 99, 99, 10, 99, 99, 99, 11, 99, 99, 99]  # block 2 = slots 8..11
    assert first == positions and ctx == [p + 1 for p in positions]
    where, what = rest[: len(rest) // 2], rest[len(rest) // 2 :]
    assert where == [*range(0, 8), *range(8, 11), *range(16, 19), *range(24, 27)]
    assert what == [28, 29, 30, 31, 8, 9, 10, 11, 20, 21, 22, *[99] * 6]
    assert chain.rows[:2] == [([7, 2], 8), ([5], 3)] and chain.rows[2:] == [None, None]
    # one position on, inside what the rows hold: only the padding lanes' entries again
    steps = [Step(a, 6, 7, pending_row=0), Step(b, 2, 3, pending_row=1)]
    rest = chain.layout(steps, [2, 1], scratch=99)[52:]
    assert rest[: len(rest) // 2] == [*range(16, 19), *range(24, 27)]
    # lane b moved to new blocks (preempted and back): its row is rewritten from the start
    b.block_table.truncate(0)
    b.block_table.append([6])
    rest = chain.layout(steps, [2, 1], scratch=99)[52:]
    where, what = rest[: len(rest) // 2], rest[len(rest) // 2 :]
    assert where[:3] == [8, 9, 10] and what[:3] == [24, 25, 26]
