"""The runner's block tables (lanes/block_tables.py): only changed entries cross to the device,
and the context slots gathered there equal the lanes' own."""

from __future__ import annotations

import random

from lanes import EngineConfig, SamplingParams, build_engine
from lanes.block_tables import BlockTables
from lanes.cache.block_table import BlockTable


def _table(blocks: list[int], bs: int) -> BlockTable:
    t = BlockTable(bs)
    t.append(blocks)
    return t


def test_context_slots_equal_the_lanes_own_and_only_changes_are_sent():
    bs, rng = 4, random.Random(0)
    tables = BlockTables(bs, max_blocks=16, device="cpu", num_slots=2)
    lanes = {slot: rng.sample(range(100), 5) for slot in range(5)}  # grows past 2 slots
    for slot, blocks in lanes.items():
        tables.sync(slot, blocks)
    assert tables.entries_sent == 0  # queued until a forward needs them
    contexts = [(3, 17), (0, 1), (4, 20), (1, 9)]
    got = tables.context_slots(contexts).tolist()
    want = [s for slot, ctx in contexts for s in _table(lanes[slot], bs).slots(0, ctx)]
    assert got == want
    assert tables.entries_sent == 25
    tables.sync(3, lanes[3])  # unchanged: nothing to send
    tables.sync(0, [*lanes[0], 61])  # a block appended: one entry
    tables.sync(1, lanes[1][:2] + [62, 63])  # truncated and regrown: two entries
    tables.context_slots([(0, 24), (1, 16)])
    assert tables.entries_sent == 25 + 1 + 2
    assert tables.context_slots([(0, 24), (1, 16)]).tolist() == (
        _table([*lanes[0], 61], bs).slots(0, 24) + _table(lanes[1][:2] + [62, 63], bs).slots(0, 16)
    )


def test_an_entry_changed_twice_before_a_flush_is_sent_once_with_its_latest_value():
    """On the GPU a scatter of duplicate indices keeps an arbitrary value: each entry goes once."""
    tables = BlockTables(4, max_blocks=4, device="cpu")
    tables.sync(0, [1, 2])
    tables.sync(0, [1, 3])  # drafts' block released and another reserved, no eager forward between
    tables.sync(0, [1, 4, 5])
    assert tables.context_slots([(0, 12)]).tolist() == _table([1, 4, 5], 4).slots(0, 12)
    assert tables.entries_sent == 3


class ResendingTables(BlockTables):
    """The negative control: every sync sends a lane's whole table again."""

    def sync(self, slot, blocks):
        self.rows[slot].blocks = [] if slot < len(self.rows) else None
        super().sync(slot, blocks)


def _decode(llama_dir, tables_type=None):
    engine = build_engine(str(llama_dir), EngineConfig(block_size=16, prefill_chunk=64))
    if tables_type is not None:
        t = engine.runner.tables
        engine.runner.tables = tables_type(t.block_size, t.max_blocks, t.device)
    prompts = [[3 + (7 * i + j) % 300 for j in range(40 + 9 * i)] for i in range(3)]
    outs = engine.generate(prompts, SamplingParams(max_tokens=60, ignore_eos=True))
    blocks = sum(-(-(len(p) + 60) // 16) for p in prompts)
    return engine.runner.tables.entries_sent, blocks, outs


def test_decode_sends_each_block_once(llama_dir):
    sent, blocks, outs = _decode(llama_dir)
    assert sent == blocks  # each block of each lane once
    resent, _, again = _decode(llama_dir, ResendingTables)
    assert resent > 5 * blocks  # the control resends whole tables every forward ...
    assert [o.token_ids for o in again] == [o.token_ids for o in outs]  # ... same tokens
