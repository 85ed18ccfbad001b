"""Mixed graphs (lanes/mixed_graphs.py): decode rows beside a prompt chunk in one graph bucket.

On the CPU the buckets run without capture (the layout's static buffers, Triton's interpreter);
on a GPU they are captured and replayed. Either way a long prompt arriving among decoding lanes
gives every lane the tokens and logprobs of the eager forwards, greedy and seeded.
"""

from __future__ import annotations

import pytest
import torch

import lanes.mixed_graphs
from lanes import EngineConfig, SamplingParams, build_engine
from lanes.graphs import DecodeGraphs
from lanes.mixed_graphs import CHUNK_BUCKETS, LANE_BUCKETS, MixedGraphs
from lanes.rounds import Step, lane_rows

GPU = torch.cuda.is_available()
GREEDY = SamplingParams(max_tokens=10, ignore_eos=True)
SEEDED = SamplingParams(max_tokens=10, ignore_eos=True, temperature=0.8, seed=11)


def _engine(llama_dir, graphs: bool):
    """The tiny llama in exact mode with chunks of at most 48 tokens; with `graphs`, decode and
    mixed buckets (captured on a GPU, run on their static buffers on the CPU)."""
    config = EngineConfig(
        device="cuda" if GPU else "cpu", kernels="triton", dtype="float32",
        cuda_graphs=graphs and GPU, capture_at_start=False, prefill_chunk=48,
        prefill_share=0.3, prompt_cache_bytes=0,
    )  # fmt: skip
    engine = build_engine(str(llama_dir), config)
    runner = engine.runner
    if graphs and not GPU:
        positions = runner.num_blocks * engine.config.block_size
        runner.graphs = DecodeGraphs(
            runner.decoder, runner.kv, runner.tables, scratch_slot=positions,
            max_ctx=min(runner.decoder.cfg.max_position_embeddings, positions), eager=True,
        )  # fmt: skip
        runner.mixed = MixedGraphs(runner.graphs)
    return engine


def _arrivals(engine, params):
    """Three lanes decode; then two long prompts arrive one after the other, each chunked beside
    them (the second in other blocks than the first). Every request's (tokens, logprobs)."""
    ids = [engine.add_request([5 + i + j for j in range(20 + 9 * i)], params) for i in range(3)]
    lanes = {lane.request_id: lane for lane in engine.running + engine.waiting}
    done = {}

    def step_until(ready):
        while not ready():
            done.update((c.request_id, (c.token_ids, c.logprobs)) for c in engine.step())

    step_until(lambda: all(len(lanes[i].token_times) >= 2 for i in ids))
    for n, offset in ((150, 40), (130, 90)):
        long_id = engine.add_request([(offset + 3 * j) % 250 + 1 for j in range(n)], params)
        ids.append(long_id)
        lane = next(x for x in engine.running + engine.waiting if x.request_id == long_id)
        step_until(lambda lane=lane: bool(lane.token_times))
    step_until(lambda: not engine.has_work())
    return [done[i] for i in ids]


@pytest.fixture(scope="module")
def eager_outputs(llama_dir):
    """The eager engine's outputs of the arrivals, by sampling params (each made once)."""
    made = {}

    def of(params):
        if id(params) not in made:
            made[id(params)] = _arrivals(_engine(llama_dir, graphs=False), params)
        return made[id(params)]

    return of


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_mixed_rounds_in_graph_buckets_give_the_eager_tokens(llama_dir, eager_outputs, params):
    eager = eager_outputs(params)
    engine = _engine(llama_dir, graphs=True)
    graphed = _arrivals(engine, params)
    assert engine.runner.mixed.num_replays > 0
    assert graphed == eager


def test_a_stale_context_in_the_shared_slots_changes_tokens(llama_dir, eager_outputs, monkeypatch):
    """The negative control: regions of the shared kv_slots taken as still right whatever
    blocks the lane now has (the second long prompt reads the first one's slots)."""
    eager = eager_outputs(GREEDY)
    monkeypatch.setattr(
        lanes.mixed_graphs, "valid_slots", lambda row, blocks, bs: row[1] if row else 0
    )
    engine = _engine(llama_dir, graphs=True)
    assert engine.runner.mixed.num_replays == 0
    assert _arrivals(engine, GREEDY) != eager
    assert engine.runner.mixed.num_replays > 0


class _Lane:
    def __init__(self, slot: int, tokens: list[int], blocks: list[int]) -> None:
        from lanes.cache.block_table import BlockTable

        self.slot = slot
        self.tokens = tokens
        self.num_known = len(tokens)
        self.block_table = BlockTable(16)
        self.block_table.append(blocks)

    def token_ids(self, start: int, end: int) -> list[int]:
        return self.tokens[start:end]


def test_which_forwards_take_a_bucket(long_model_dir):
    """Decode rows then one chunk of at most the last bucket's rows: the smallest buckets that
    hold them. Anything else (no decode rows, two chunks, a chunk first, a verify row, a long
    chunk) runs eagerly."""
    mixed = _engine(long_model_dir, graphs=True).runner.mixed
    decoding = [_Lane(i, list(range(40)), [i]) for i in range(5)]
    prompt = _Lane(9, list(range(700)), list(range(20, 64)))
    decode = [Step(x, 39, 40, num_logits=1) for x in decoding]
    chunk = Step(prompt, 32, 32 + 70)
    assert mixed.bucket(lane_rows([*decode, chunk])) == (LANE_BUCKETS[1], 128)
    assert mixed.bucket(lane_rows([decode[0], Step(prompt, 0, 16, num_logits=0)])) == (4, 32)
    last = Step(prompt, 700 - CHUNK_BUCKETS[-1], 700, num_logits=1)
    assert mixed.bucket(lane_rows([*decode, last])) == (16, CHUNK_BUCKETS[-1])
    assert mixed.bucket(lane_rows([chunk])) is None
    assert mixed.bucket(lane_rows([chunk, *decode])) is None
    assert mixed.bucket(lane_rows([*decode, chunk, Step(prompt, 102, 118)])) is None
    verify = Step(decoding[0], 39, 41, num_logits=2, draft_ids=(3,))
    assert mixed.bucket(lane_rows([verify, chunk])) is None
    long = Step(prompt, 0, CHUNK_BUCKETS[-1] + 16)
    assert mixed.bucket(lane_rows([*decode, long])) is None
