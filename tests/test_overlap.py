"""Overlapped rounds (lanes/inflight.py) give exactly the synchronous output: tokens, logprobs,
text and finish reasons, for greedy and seeded lanes that overlap and for the drafted and
top_logprobs lanes beside them that do not; lanes that stop early, join late or are cancelled;
no block leaked. On the CPU nothing runs asynchronously, but every step of the mechanism runs:
round N+1 is launched reading N's tokens from the device tensor before N is taken."""

from __future__ import annotations

import dataclasses
import random

import pytest

from lanes import EngineConfig, SamplingParams, build_engine
from lanes.drafter.replay import ReplayProposer

RNG = random.Random(15)
PROMPTS = [[RNG.randrange(3, 380) for _ in range(n)] for n in (5, 17, 40, 9, 64, 23)]


def _params(tokenizer_stop: str) -> list[SamplingParams]:
    greedy = SamplingParams(max_tokens=14, ignore_eos=True)
    return [
        greedy,
        dataclasses.replace(greedy, max_tokens=1),  # ends in its first decode round
        dataclasses.replace(greedy, max_tokens=21, stop=(tokenizer_stop,)),
        dataclasses.replace(greedy, max_tokens=9),
        dataclasses.replace(greedy, max_tokens=12, draft=False),
        dataclasses.replace(greedy, max_tokens=17),
    ]


def _run(engine, params, late: tuple[int, ...] = (), cancel_at: dict[int, int] | None = None):
    """Submit all prompts but `late` ones, which join after 6 rounds; cancel request i at the
    round cancel_at[i]. Returns the completions in prompt order."""
    ids, done, rounds = {}, {}, 0
    for i, (p, sp) in enumerate(zip(PROMPTS, params, strict=True)):
        if i not in late:
            ids[i] = engine.add_request(p, sp)
    while engine.has_work() or len(ids) < len(PROMPTS):
        if rounds == 6:
            for i in late:
                ids[i] = engine.add_request(PROMPTS[i], params[i])
        for i, r in (cancel_at or {}).items():
            if r == rounds:
                engine.cancel(ids[i])
        done.update((c.request_id, c) for c in engine.step())
        engine.check_integrity()
        rounds += 1
    assert engine.cache.num_available == engine.pool.num_blocks  # no lane holds a block
    return [done[ids[i]] for i in range(len(PROMPTS))]


def _same(got, want) -> None:
    for g, w in zip(got, want, strict=True):
        assert (g.token_ids, g.logprobs, g.text, g.finish_reason) == (
            w.token_ids,
            w.logprobs,
            w.text,
            w.finish_reason,
        )
        assert g.top_logprobs == w.top_logprobs


@pytest.fixture(scope="module")
def stop_text(llama_dir):
    """A stop string the greedy output of prompt 2 reaches part-way (found by a first run)."""
    engine = build_engine(str(llama_dir), EngineConfig(overlap=False))
    out = engine.generate([PROMPTS[2]], SamplingParams(max_tokens=21, ignore_eos=True))[0]
    return out.text[len(out.text) // 2 :][:2]


def _engines(llama_dir, **config):
    sync = build_engine(str(llama_dir), EngineConfig(overlap=False, prefill_chunk=32, **config))
    over = build_engine(str(llama_dir), EngineConfig(overlap=True, prefill_chunk=32, **config))
    return sync, over


@pytest.mark.parametrize("late", [(), (4, 5)])
def test_overlapped_equals_synchronous_greedy(llama_dir, stop_text, late):
    params = _params(stop_text)
    sync, over = _engines(llama_dir)
    want, got = _run(sync, params, late), _run(over, params, late)
    _same(got, want)
    assert want[2].finish_reason == "stop" and len(want[1].token_ids) == 1
    assert sync.metrics.num_overlapped_rounds == 0
    assert over.metrics.num_overlapped_rounds >= 5  # the mechanism ran, not only the fallback


def test_overlapped_beside_seeded_drafted_and_top_logprobs_lanes(llama_dir, stop_text):
    """Lanes that cannot overlap (top_logprobs, drafting) make their rounds planned ones; when
    they end, the lanes left overlap again. Output equals the synchronous."""
    params = _params(stop_text)
    params[0] = dataclasses.replace(params[0], temperature=0.8, seed=11, max_tokens=4)
    params[5] = dataclasses.replace(params[5], top_logprobs=3, max_tokens=5)
    params[3] = dataclasses.replace(params[3], max_tokens=6)  # the drafting lane
    sync, over = _engines(llama_dir)
    record = sync.generate([PROMPTS[3]], params[3])[0].token_ids
    vocab = sync.model_config.vocab_size
    for engine in (sync, over):  # drafts right half of the time, the same in both engines
        engine.proposer = ReplayProposer({tuple(PROMPTS[3]): record}, 0.5, vocab)
    params = [p if i == 3 else dataclasses.replace(p, draft=False) for i, p in enumerate(params)]
    want, got = _run(sync, params), _run(over, params)
    _same(got, want)
    assert sum(c.num_drafted for c in want) > 0  # the drafting lane drafted
    assert over.metrics.num_overlapped_rounds > 0


def _seeded(params: list[SamplingParams]) -> list[SamplingParams]:
    """The same lanes sampled (position-keyed noise), undrafted: all of them can overlap."""
    shapes = [
        {"temperature": 0.8},
        {"temperature": 1.1, "top_p": 0.9},
        {"temperature": 0.7, "top_k": 20},
        {"temperature": 0.9, "top_k": 40, "top_p": 0.8},
    ]
    return [
        dataclasses.replace(p, draft=False, seed=100 + i, **shapes[i % len(shapes)])
        for i, p in enumerate(params)
    ]


def test_overlapped_equals_synchronous_seeded(llama_dir, stop_text):
    """Seeded lanes overlap too (their rows sampled where the tokens stay, at each row's own
    position), with the synchronous path's tokens and logprobs."""
    params = _seeded(_params(stop_text))
    sync, over = _engines(llama_dir)
    want, got = _run(sync, params, late=(4,)), _run(over, params, late=(4,))
    _same(got, want)
    assert over.metrics.num_overlapped_rounds >= 5


def test_negative_control_seeded_rows_launched_at_the_wrong_position(
    llama_dir, stop_text, monkeypatch
):
    """Launched rows sampled with the noise of the position before theirs: the equality above
    fails."""
    import lanes.inflight
    from lanes.device_sampling import sample_rows

    def shifted(logits, rows, use_triton, on_device=None):
        return sample_rows(logits, [(p, pos - 1) for p, pos in rows], use_triton, on_device)

    params = _seeded(_params(stop_text))
    sync, over = _engines(llama_dir)
    want = _run(sync, params)
    monkeypatch.setattr(lanes.inflight, "sample_rows", shifted)
    got = _run(over, params)
    assert [g.token_ids for g in got] != [w.token_ids for w in want]


def test_cancelled_lanes_end_and_the_rest_are_unchanged(llama_dir, stop_text):
    params = _params(stop_text)
    sync, over = _engines(llama_dir)
    want = _run(sync, params)
    got = _run(over, params, cancel_at={0: 9})
    assert got[0].finish_reason == "cancelled"
    assert got[0].token_ids == want[0].token_ids[: len(got[0].token_ids)]
    _same(got[1:], want[1:])


def test_negative_control_a_wrong_pending_row_is_caught(llama_dir, stop_text, monkeypatch):
    """Without the device-to-device copy of each lane's pending token (the runner reads the
    placeholder 0 instead), the equality above fails."""
    import lanes.runner

    params = _params(stop_text)
    sync, over = _engines(llama_dir)
    want = _run(sync, params)
    monkeypatch.setattr(lanes.runner, "fill_pending", lambda *a: None)
    got = _run(over, params)
    assert [g.token_ids for g in got] != [w.token_ids for w in want]


def test_overlap_with_preemption_loses_nothing(llama_dir):
    """A KV pool too small for every lane: rounds on top give way to planned rounds that
    preempt lanes; outputs equal the synchronous engine's."""
    block = 2 * 2 * 2 * 16 * 16 * 4  # one block: 2 layers, K and V, 2 heads, 16 dims, fp32
    config = {"kv_cache_bytes": 20 * block, "prompt_cache_bytes": 4 * block}
    sync, over = _engines(llama_dir, **config)
    params = [SamplingParams(max_tokens=30 + 5 * i, ignore_eos=True) for i in range(6)]
    want, got = _run(sync, params), _run(over, params)
    _same(got, want)
    assert over.metrics.num_preemptions > 0 and over.metrics.num_overlapped_rounds > 0


def test_a_retry_resumes_what_an_overlapped_run_computed(llama_dir):
    """resumed == fresh with overlap: a request cancelled mid-decode leaves its blocks in the
    prompt cache; the identical retry finds them and gives the fresh output."""
    prompt = PROMPTS[4] + PROMPTS[5]  # 87 tokens
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    fresh = build_engine(str(llama_dir), EngineConfig(overlap=False)).generate([prompt], params)[0]
    engine = build_engine(str(llama_dir), EngineConfig(overlap=True, prefill_chunk=32))
    rid = engine.add_request(prompt, params)
    for _ in range(25):
        engine.step()
    engine.cancel(rid)
    while engine.has_work():
        engine.step()
    assert engine.metrics.num_overlapped_rounds > 0
    retry = engine.generate([prompt], params)[0]
    assert retry.cached_tokens > len(prompt) - 16  # the prompt's blocks, and decoded ones
    assert retry.token_ids == fresh.token_ids and retry.logprobs == fresh.logprobs


def test_overlapped_server_streams_equal_solo_with_disconnects(long_model_dir):
    """Over HTTP: 12 concurrent greedy streams, a third hanging up early, on an engine that
    overlaps its rounds; completed streams equal their solo output, no block is leaked."""
    import time

    from tests.live_server import MODEL, LiveServer, read_stream, run_clients

    rng = random.Random(9)
    prompts = [[rng.randrange(3, 380) for _ in range(rng.randint(5, 120))] for _ in range(12)]
    config = EngineConfig(overlap=True, prefill_chunk=16, max_lanes=16)
    engine = build_engine(str(long_model_dir), config)
    kw = {"model": MODEL, "max_tokens": 14, "temperature": 0, "extra_body": {"ignore_eos": True}}
    with LiveServer(engine) as server:
        client = server.client()
        solo = [client.completions.create(prompt=p, **kw).choices[0].text for p in prompts]

        async def one(i, aclient):
            stream = await aclient.completions.create(prompt=prompts[i], stream=True, **kw)
            return await read_stream(stream, 3 if i % 3 == 0 else None)

        results = run_clients(server, one, 12)
        deadline = time.time() + 30
        while server.kv()["active_lanes"] and time.time() < deadline:
            time.sleep(0.05)
        kv = server.kv()
    completed = [(i, t) for i, t in enumerate(results) if t is not None]
    assert len(completed) >= 8
    assert all(text == solo[i] for i, text in completed)
    assert kv["integrity"] == "ok" and kv["blocks_owned_by_lanes"] == 0
    assert engine.metrics.num_overlapped_rounds > 0


def test_a_failed_launch_on_top_falls_back_to_a_planned_round(llama_dir, stop_text):
    """If launching round N+1 on N's tokens raises, N is taken and a planned round (with its
    own failure boundaries) runs instead: nobody fails, outputs are unchanged."""
    params = _params(stop_text)
    sync, over = _engines(llama_dir)
    want = _run(sync, params)
    execute, calls = over.runner.execute, {"n": 0}

    def flaky(steps, all_logits=False, previous_tokens=None):
        if previous_tokens is not None:
            calls["n"] += 1
            if calls["n"] % 3 == 1:
                raise RuntimeError("injected")
        return execute(steps, all_logits, previous_tokens)

    over.runner.execute = flaky
    got = _run(over, params)
    _same(got, want)
    assert calls["n"] > 3 and over.metrics.num_failures == 0
