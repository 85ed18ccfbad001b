"""Tensor parallelism on the CPU: 2 processes over gloo. A tiny model at TP=2 gives logits close
to TP=1 and the same greedy tokens, and the three equalities hold at TP=2."""

from __future__ import annotations

import pytest
import torch

from lanes import Engine, EngineConfig, SamplingParams, build_engine
from lanes.build import run_tensor_parallel

PROMPTS = [[5 + i for i in range(n)] for n in (7, 40, 90)]
GREEDY = SamplingParams(max_tokens=12, ignore_eos=True)
SEEDED = SamplingParams(max_tokens=12, ignore_eos=True, temperature=0.8, top_p=0.9, seed=4)


def job_logits_and_greedy(engine: Engine):
    (logits,) = engine.prompt_logits([PROMPTS[1]])
    return logits, [c.token_ids for c in engine.generate(PROMPTS, GREEDY)]


def _solo(engine, params, salt):
    return [engine.generate([p], params, cache_salt=salt)[0].token_ids for p in PROMPTS]


def job_equalities(engine: Engine):
    from lanes.drafter.replay import ReplayProposer

    out = {}
    for name, params in (("greedy", GREEDY), ("seeded", SEEDED)):
        solo = _solo(engine, params, f"solo-{name}")
        together = [c.token_ids for c in engine.generate(PROMPTS, params, cache_salt=f"c-{name}")]
        engine.proposer = ReplayProposer(
            {tuple(p): s for p, s in zip(PROMPTS, solo, strict=True)},
            0.5,
            engine.model_config.vocab_size,
        )
        drafted = [c.token_ids for c in engine.generate(PROMPTS, params, cache_salt=f"d-{name}")]
        engine.proposer = None
        resumed, cached = [], []
        for p in PROMPTS:  # cancel once mid-prompt (after a 16-token chunk), then retry
            rid = engine.add_request(p, params, cache_salt=f"r-{name}")
            engine.cancel_check = lambda r, rid=rid: (
                r == rid
                and any(x.request_id == rid and x.num_computed >= 16 for x in engine.running)
            )
            while not any(c.request_id == rid for c in engine.step()):
                pass
            engine.cancel_check = None
            (retry,) = engine.generate([p], params, cache_salt=f"r-{name}")
            resumed.append(retry.token_ids)
            cached.append(retry.cached_tokens)
        engine.check_integrity()
        out[name] = {
            "solo": solo,
            "together": together,
            "drafted": drafted,
            "resumed": resumed,
            "cached": cached,
        }
    return out


def test_tp2_matches_tp1(llama_dir):
    config = EngineConfig(prefill_chunk=16)
    logits2, greedy2 = run_tensor_parallel(2, str(llama_dir), config, job_logits_and_greedy)
    tp1 = build_engine(str(llama_dir), config)
    (logits1,) = tp1.prompt_logits([PROMPTS[1]])
    torch.testing.assert_close(logits2, logits1, rtol=1e-4, atol=1e-4)
    assert greedy2 == [c.token_ids for c in tp1.generate(PROMPTS, GREEDY)]


def test_tp2_three_equalities(llama_dir):
    results = run_tensor_parallel(2, str(llama_dir), EngineConfig(prefill_chunk=16), job_equalities)
    for name, r in results.items():
        assert r["together"] == r["solo"], name
        assert r["drafted"] == r["solo"], name
        assert r["resumed"] == r["solo"], name
        assert all(c > 0 for c in r["cached"][1:]), (
            name
        )  # the longer prompts resumed from the cache


@pytest.mark.parametrize("arch", ["glm4_moe", "qwen3_moe"])
def test_tp2_mixture_of_experts(tiny_models, arch):
    """GLM-4 MoE (a dense first layer, sigmoid-grouped routing, an ungated shared expert) and
    Qwen3-MoE sharded over 2 ranks, experts split by their intermediate width: logits close to one
    rank's, the same greedy tokens, and concurrent == solo, drafted == solo, resumed after
    cancel_prefill == solo, greedy and seeded."""
    model = str(tiny_models[arch][0])
    config = EngineConfig(prefill_chunk=16)
    logits2, greedy2 = run_tensor_parallel(2, model, config, job_logits_and_greedy)
    tp1 = build_engine(model, config)
    (logits1,) = tp1.prompt_logits([PROMPTS[1]])
    torch.testing.assert_close(logits2, logits1, rtol=1e-4, atol=1e-4)
    assert greedy2 == [c.token_ids for c in tp1.generate(PROMPTS, GREEDY)]
    for name, r in run_tensor_parallel(2, model, config, job_equalities).items():
        assert r["together"] == r["solo"] == r["drafted"] == r["resumed"], name
        assert all(c > 0 for c in r["cached"][1:]), name


def job_resumed_with_rank0_copy_lost(engine: Engine):
    """Cancel each prompt mid-prefill as job_equalities does, then lose rank 0's copy of the KV
    its cache lists (zeroed there alone) before the retry: the negative control."""
    solo = _solo(engine, GREEDY, "solo")
    resumed, cached = [], []
    for p in PROMPTS[1:]:
        rid = engine.add_request(p, GREEDY, cache_salt="lost")
        engine.cancel_check = lambda r, rid=rid: (
            r == rid and any(x.request_id == rid and x.num_computed >= 16 for x in engine.running)
        )
        while not any(c.request_id == rid for c in engine.step()):
            pass
        engine.cancel_check = None
        for layer in range(len(engine.runner.kv.k)):  # this rank's shard only
            engine.runner.kv.k[layer].zero_()
            engine.runner.kv.v[layer].zero_()
        (retry,) = engine.generate([p], GREEDY, cache_salt="lost")
        resumed.append(retry.token_ids)
        cached.append(retry.cached_tokens)
    return solo[1:], resumed, cached


@pytest.mark.parametrize("arch", ["llama", "glm4_moe"])
def test_tp2_resume_needs_every_ranks_copy(tiny_models, arch):
    """Negative control for the resumed equality at TP 2: with rank 0's copy of the cached KV
    lost before the retry, the retry still resumes from the cache, and its tokens differ."""
    model = str(tiny_models[arch][0])
    solo, resumed, cached = run_tensor_parallel(
        2, model, EngineConfig(prefill_chunk=16), job_resumed_with_rank0_copy_lost
    )
    assert all(c > 0 for c in cached)
    assert resumed != solo
