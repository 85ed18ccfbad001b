"""Which kv_slots entries a CUDA graph's lane row still holds (the bookkeeping runs on the CPU)."""

from __future__ import annotations

from lanes.block_tables import BlockTables
from lanes.cache.block_table import BlockTable
from lanes.chain_graphs import LaneSlots, _Chain
from lanes.graphs import _Graph
from lanes.rounds import Step, lane_rows


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

    def __init__(self, tokens: list[int], blocks: list[int], slot: int) -> None:
        self.slot = slot
        self.tokens = tokens
        self.num_known = len(tokens)
        self.block_table = BlockTable(4)
        self.block_table.append(blocks)

    def token_ids(self, start: int, end: int) -> list[int]:
        return self.tokens[start:end]


def _layout(chain: _Chain, steps: list[Step], counts: list[int], tables: BlockTables):
    """The chain's layout of these steps, as ChainGraphs.run makes it: the steps as the runner
    takes them (plain data), the runner's block tables synced from them."""
    rows = lane_rows(steps)
    for r in rows:
        tables.sync(r.slot, r.blocks)
    return chain.layout(rows, counts, 99, tables)


def test_chain_layout_steps_lanes_and_padding():
    """A (4 lanes, T = 2, S = 3) chain over two lanes: one catches up positions 4..5 and wants 3
    samples (forwards 1, 2 at positions 6, 7), one catches up 1..2 and wants 1 (its later
    forwards repeat position 2 and write to the scratch slot), and two padding lanes; kv_slots
    entries are set once and only where they are not already right."""
    slots = LaneSlots(lanes=4, max_ctx=8, scratch=99, device="cpu")
    chain = _Chain(lanes=4, tokens=2, num_steps=3, slots=slots, feature_row=None)
    a, b = _Lane(list(range(10, 16)), [7, 2], slot=0), _Lane([20, 21, 22], [5], slot=1)
    tables = BlockTables(4, max_blocks=2, device="cpu")
    steps = [Step(a, 4, 6), Step(b, 1, 3)]
    values = _layout(chain, steps, [3, 1], tables)
    first, later, meta, rest = values[:24], values[24:40], values[40:64], values[64:]
    assert first[:8] == [14, 15, 21, 22, 0, 0, 0, 0]  # forward 0's ids
    assert first[8:16] == [4, 5, 1, 2, 0, 1, 0, 1]  # its positions
    assert first[16:] == [8, 9, 21, 22, 99, 99, 99, 99]  # its KV slots (block 2 = slots 8..11)
    assert later[:8] == [6, 2, 1, 1, 7, 2, 1, 1]  # forwards 1, 2: positions [step][lane]
    assert later[8:] == [10, 99, 99, 99, 11, 99, 99, 99]  # and KV slots
    assert meta[:12] == [4, 1, 0, 0, 6, 2, 1, 1, 7, 2, 1, 1]  # first positions
    assert meta[12:] == [6, 3, 2, 2, 7, 3, 2, 2, 8, 3, 2, 2]  # context lengths
    where, what = rest[: len(rest) // 2], rest[len(rest) // 2 :]
    assert where == [*range(0, 8), *range(8, 11), 16, 17, 24, 25]
    assert what == [28, 29, 30, 31, 8, 9, 10, 11, 20, 21, 22, 99, 99, 99, 99]
    assert slots.rows[:2] == [([7, 2], 8), ([5], 3)] and slots.rows[2:] == [None, None]
    # one position on, inside what the rows hold: only the padding lanes' entries again, and
    # another chain of the same lane bucket shares what this one wrote
    other = _Chain(lanes=4, tokens=1, num_steps=2, slots=slots, feature_row=None)
    steps = [Step(a, 6, 7, pending_row=0), Step(b, 2, 3)]
    rest = _layout(other, steps, [2, 1], tables)[4 * 3 + 2 * 1 * 4 + 2 * 2 * 4 :]
    assert rest[: len(rest) // 2] == [16, 24]
    # lane b moved to new blocks (preempted and back): its row is rewritten from the start
    b.block_table.truncate(0)
    b.block_table.append([6])
    rest = _layout(other, steps, [2, 1], tables)[36:]
    where, what = rest[: len(rest) // 2], rest[len(rest) // 2 :]
    assert where[:3] == [8, 9, 10] and what[:3] == [24, 25, 26]
