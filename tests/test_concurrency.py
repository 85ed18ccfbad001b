"""concurrent == solo: any batch, chunking, share and preemption gives each request its solo
output, token for token and logprob for logprob."""

from __future__ import annotations

import random

import pytest

from lanes import Engine, EngineConfig, SamplingParams, build_engine

RNG = random.Random(3)
PROMPTS = [[RNG.randrange(3, 380) for _ in range(n)] for n in (5, 17, 40, 64, 90, 33, 150, 8)]
PARAMS = [
    SamplingParams(max_tokens=10 + i, ignore_eos=True, temperature=0.0 if i % 2 else 0.8, seed=i)
    for i in range(len(PROMPTS))
]


@pytest.fixture(scope="module")
def solo(llama_dir):
    engine = build_engine(str(llama_dir))
    return [
        engine.generate([p], sp, cache_salt=f"solo{i}")[0]
        for i, (p, sp) in enumerate(zip(PROMPTS, PARAMS, strict=True))
    ]


def _run_staggered(engine: Engine, stagger: int):
    """Submit the requests `stagger` rounds apart (0: all at once); collect completions."""
    ids, done = [], {}
    for p, sp in zip(PROMPTS, PARAMS, strict=True):
        ids.append(engine.add_request(p, sp))
        for _ in range(stagger):
            done.update((c.request_id, c) for c in engine.step())
    while engine.has_work():
        done.update((c.request_id, c) for c in engine.step())
        engine.check_integrity()
    return [done[i] for i in ids]


@pytest.mark.parametrize("share", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("stagger", [0, 2])
def test_concurrent_equals_solo(llama_dir, solo, share, stagger):
    engine = build_engine(str(llama_dir), EngineConfig(prefill_share=share, prefill_chunk=32))
    for got, want in zip(_run_staggered(engine, stagger), solo, strict=True):
        assert got.token_ids == want.token_ids
        assert got.logprobs == want.logprobs
    assert engine.metrics.num_rounds > 0 and engine.metrics.prefill_tokens > 0


def test_preemption_loses_nothing(llama_dir, solo):
    """A KV pool too small for all lanes at once: lanes are preempted and recomputed."""
    mc_bytes = 2 * 2 * 2 * 16 * 16 * 4  # one block: 2 layers, K and V, 2 heads, 16 dims, fp32
    engine = build_engine(
        str(llama_dir),
        EngineConfig(
            kv_cache_bytes=24 * mc_bytes, prefill_chunk=32, prompt_cache_bytes=4 * mc_bytes
        ),
    )
    assert engine.pool.num_blocks == 24
    for got, want in zip(_run_staggered(engine, 0), solo, strict=True):
        assert got.token_ids == want.token_ids
        assert got.logprobs == want.logprobs
    assert engine.metrics.num_preemptions > 0
    engine.check_integrity()
    assert engine.cache.num_cached <= engine.cache.max_blocks


def test_random_admit_cancel_finish_keeps_integrity(llama_dir):
    rng = random.Random(5)
    engine = build_engine(
        str(llama_dir), EngineConfig(kv_cache_bytes=2**16, prefill_chunk=16, max_lanes=4)
    )
    live: list[int] = []
    for _ in range(150):
        r = rng.random()
        if r < 0.3:
            p = PROMPTS[rng.randrange(len(PROMPTS))][: rng.randint(1, 60)]
            live.append(engine.add_request(p, SamplingParams(max_tokens=rng.randint(1, 12))))
        elif r < 0.4 and live:
            engine.cancel(live.pop(rng.randrange(len(live))))
        for c in engine.step():
            if c.request_id in live:
                live.remove(c.request_id)
        engine.check_integrity()
        assert engine.cache.num_cached <= engine.cache.max_blocks
    while engine.has_work():
        engine.step()
    engine.check_integrity()
    engine.cache.clear()
    assert engine.pool.num_free == engine.pool.num_blocks
