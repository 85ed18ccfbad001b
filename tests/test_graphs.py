"""CUDA graphs replay decode and verify forwards with the eager bits (GPU only)."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch

from bench.shapes import TINY, TINY_MOE, random_checkpoint
from lanes import EngineConfig, SamplingParams, build_engine
from lanes.drafter.replay import ReplayProposer

# drafts of a fixed length, not chosen from measured times (which differ from run to run)
FIXED_K = dict(num_draft_tokens=4, adaptive_drafts=False, cost_aware_drafts=False)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_tokens=24, ignore_eos=True),
        SamplingParams(max_tokens=24, ignore_eos=True, temperature=0.8, seed=3),
    ],
)
def test_graphed_equals_eager(params):
    ckpt = random_checkpoint(TINY, "cuda")
    prompts = [
        [(7 * i + j) % TINY.vocab_size for j in range(n)] for i, n in enumerate((5, 40, 130))
    ]
    eager = build_engine(checkpoint=ckpt, config=EngineConfig(device="cuda", cuda_graphs=False))
    graphed = build_engine(checkpoint=ckpt, config=EngineConfig(device="cuda"))
    want = eager.generate(prompts, params)
    got = graphed.generate(prompts, params)
    assert graphed.runner.graphs.num_replays > 0
    for g, w in zip(got, want, strict=True):
        assert g.token_ids == w.token_ids and g.logprobs == w.logprobs
    # verify steps (1 + 4 drafts per lane) replay too, and stay exact
    records = {tuple(p): w.token_ids for p, w in zip(prompts, want, strict=True)}
    graphed.proposer = ReplayProposer(records, 0.7, TINY.vocab_size)
    before = graphed.runner.graphs.num_replays
    drafted = graphed.generate(prompts, params, cache_salt="d")
    assert graphed.runner.graphs.num_replays > before
    assert [d.token_ids for d in drafted] == [w.token_ids for w in want]
    graphed.check_integrity()


def test_moe_decode_replays_as_graphs_with_the_eager_bits():
    """Routing on the device (kernels/expert_matmul.py) lets MoE decode steps be captured: the
    replays give the eager steps' tokens and logprobs, greedy and seeded."""
    ckpt = random_checkpoint(TINY_MOE, "cuda")
    prompts = [[(5 * i + j) % TINY_MOE.vocab_size for j in range(n)] for i, n in enumerate((3, 70))]
    eager = build_engine(checkpoint=ckpt, config=EngineConfig(device="cuda", cuda_graphs=False))
    graphed = build_engine(checkpoint=ckpt, config=EngineConfig(device="cuda"))
    assert graphed.runner.graphs is not None
    for params in (
        SamplingParams(max_tokens=16, ignore_eos=True),
        SamplingParams(max_tokens=16, ignore_eos=True, temperature=0.8, seed=5),
    ):
        before = graphed.runner.graphs.num_replays
        got, want = graphed.generate(prompts, params), eager.generate(prompts, params)
        assert graphed.runner.graphs.num_replays > before
        for g, w in zip(got, want, strict=True):
            assert (g.token_ids, g.logprobs) == (w.token_ids, w.logprobs)


def drafted_equals_plain(engine, prompts, params, wanted=None) -> list:
    """Generate with the engine's drafter, recording its drafts (each round's, on the host), and
    check the output equals draft: false. wanted: maps the engine's draft lengths to the ones
    asked of the drafter."""
    propose, drafts = engine.proposer.propose, []

    def recording(lanes, num_drafts):
        made = propose(lanes, num_drafts if wanted is None else wanted(num_drafts))
        drafts.append([d.host_ids() for d in made])
        return made

    engine.proposer.propose = recording
    got = engine.generate(prompts, params)
    plain = engine.generate(prompts, dataclasses.replace(params, draft=False))
    assert [g.token_ids for g in got] == [p.token_ids for p in plain]
    return drafts


@pytest.mark.parametrize("layers", [None, (0, 1)], ids=["final-feature", "two-layers"])
def test_eagle_drafter_graphed_equals_eager(tiny_models, tmp_path, layers):
    """The EAGLE-style drafter's forwards (features in a static buffer) replay as graphs and
    propose the eager drafts; output stays the undrafted one."""
    from tests.test_distill import _random_head

    target_dir, _ = tiny_models["smollm2"]
    out = tmp_path / "eagle"
    _random_head(target_dir, out, 256, layers)
    prompts = ["one two three four five", "a b c d e f g h i j k l m n o p"]
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    seen = {}
    for graphs in (False, True):
        # host-managed rounds (the head's propose): device rounds are tests/test_device_rounds
        cfg = EngineConfig(
            device="cuda", drafter=str(out), cuda_graphs=graphs, device_rounds=False, **FIXED_K
        )
        engine = build_engine(str(target_dir), cfg)
        seen[graphs] = drafted_equals_plain(engine, prompts, params)
        if graphs:  # each round's forwards chained in one replay (lanes.chain_graphs)
            assert engine.proposer.chain.num_replays > 0
    assert seen[True] == seen[False] and any(any(d) for d in seen[True])


@pytest.mark.parametrize("chained", ["no", "after-catch-up", "whole-round"])
def test_model_drafter_graphed_equals_eager(tiny_models, chained):
    """The model drafter's forwards replayed as graphs propose the eager drafts, with lanes
    wanting different numbers of drafts: each forward its own replay, the catch-up alone and
    drafts 2..k chained, or the whole round chained. Output stays the undrafted one."""
    target_dir, _ = tiny_models["llama"]
    prompts = [[(3 * i + 5 * j) % 200 for j in range(9 + 23 * i)] for i in range(3)]
    params = SamplingParams(max_tokens=18, ignore_eos=True)
    seen = {}
    for graphs in (False, True):
        cfg = EngineConfig(device="cuda", drafter=str(target_dir), cuda_graphs=graphs, **FIXED_K)
        engine = build_engine(str(target_dir), cfg)
        if graphs and chained == "no":
            engine.proposer.chain = None
        if graphs and chained == "after-catch-up":  # refuse the catch-up steps, not the rest
            chain, supports = engine.proposer.chain, engine.proposer.chain.supports
            chain.supports = lambda st, c, f=supports: (
                all(s.pending_row is not None for s in st) and f(st, c)
            )
        # different draft lengths per lane: the chain's short lanes repeat their last step
        seen[graphs] = drafted_equals_plain(
            engine, prompts, params, lambda ks: [max(min(k, 1), k - i) for i, k in enumerate(ks)]
        )
        if graphs and chained != "no":
            assert engine.proposer.chain.num_replays > 0
    assert seen[True] == seen[False] and any(any(d) for d in seen[True])


def test_graphs_keep_up_as_lanes_come_and_go():
    """Lanes that end at different steps move other lanes to new rows of a graph bucket, and
    drafts are rejected (block tables truncated): the kv_slots each replay refills only where a
    lane's context changed must still give the eager tokens."""
    ckpt = random_checkpoint(TINY, "cuda")
    prompts = [[(5 * i + j) % TINY.vocab_size for j in range(20 + 37 * i)] for i in range(6)]
    params = [SamplingParams(max_tokens=6 + 7 * i, ignore_eos=True) for i in range(6)]
    eager = build_engine(checkpoint=ckpt, config=EngineConfig(device="cuda", cuda_graphs=False))
    want = eager.generate(prompts, params)
    graphed = build_engine(checkpoint=ckpt, config=EngineConfig(device="cuda"))
    assert [g.token_ids for g in graphed.generate(prompts, params)] == [w.token_ids for w in want]
    records = {tuple(p): w.token_ids for p, w in zip(prompts, want, strict=True)}
    graphed.proposer = ReplayProposer(records, 0.5, TINY.vocab_size)
    drafted = graphed.generate(prompts[::-1], params[::-1], cache_salt="d")
    assert [d.token_ids for d in drafted] == [w.token_ids for w in want[::-1]]
    graphed.check_integrity()


def test_graphs_are_captured_when_the_engine_is_built(caplog):
    """Every lane bucket's decode graph exists before the first request (lanes/warmup.py), so no
    round stalls on a capture; with capture_at_start off they come at first use. Same tokens.
    The warm-up logs no failure (it catches and logs any, so that serving goes on)."""
    from lanes.graphs import LANE_BUCKETS

    ckpt = random_checkpoint(TINY, "cuda")
    with caplog.at_level(logging.INFO, logger="lanes"):
        ready = build_engine(checkpoint=ckpt, config=EngineConfig(device="cuda"))
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("compiled the samplers" in r.getMessage() for r in caplog.records)
    lazy = build_engine(checkpoint=ckpt, config=EngineConfig(device="cuda", capture_at_start=False))
    captured = set(ready.runner.graphs.graphs)
    assert {(n, 1) for n in LANE_BUCKETS} <= captured
    assert not lazy.runner.graphs.graphs
    prompts = [[3, 1, 4, 1, 5], [9, 2, 6]]
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    got, want = ready.generate(prompts, params), lazy.generate(prompts, params)
    assert set(ready.runner.graphs.graphs) == captured  # no round captured one
    assert lazy.runner.graphs.graphs  # these were captured by the rounds
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
