"""CUDA graphs replay decode and verify forwards with the eager bits (GPU only)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from bench.shapes import TINY, random_checkpoint
from lanes import EngineConfig, SamplingParams, build_engine
from lanes.drafter.replay import ReplayProposer

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
        cfg = EngineConfig(device="cuda", drafter=str(out), cuda_graphs=graphs)
        engine = build_engine(str(target_dir), cfg)
        propose, drafts = engine.proposer.propose, []

        def recording(lanes, num_drafts, propose=propose, drafts=drafts):
            made = propose(lanes, num_drafts)
            drafts.append([d.host_ids() for d in made])
            return made

        engine.proposer.propose = recording
        got = engine.generate(prompts, params)
        plain = engine.generate(prompts, dataclasses.replace(params, draft=False))
        assert [g.token_ids for g in got] == [p.token_ids for p in plain]
        seen[graphs] = drafts
        if graphs:
            assert engine.proposer.runner.graphs.num_replays > 0
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
