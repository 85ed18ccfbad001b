"""cancel_prefill: a cancelled request keeps its whole computed blocks; an identical retry
continues from them and gives exactly the fresh output. With negative controls."""

from __future__ import annotations

import random

import pytest

from lanes import Engine, EngineConfig, SamplingParams, build_engine
from lanes.lane import Lane

BS = 16
PROMPT = [random.Random(0).randrange(3, 380) for _ in range(100)]  # 6 whole blocks + 4 tokens
GREEDY = SamplingParams(max_tokens=12, ignore_eos=True)
SEEDED = SamplingParams(max_tokens=12, ignore_eos=True, temperature=0.7, top_p=0.9, seed=42)


@pytest.fixture()
def engine(llama_dir):
    # One block per prefill forward, so a cancellation can land after any block.
    return build_engine(str(llama_dir), EngineConfig(block_size=BS, prefill_chunk=BS))


def run(engine: Engine, params, salt="", cancel_when=None):
    """Run PROMPT to its end, or until cancel_when(lane) holds between two forwards."""
    rid = engine.add_request(PROMPT, params, cache_salt=salt)

    def check(request_id: int) -> bool:
        lane = next(
            (x for x in engine.waiting + engine.running if x.request_id == request_id), None
        )
        return request_id == rid and lane is not None and cancel_when(lane)

    engine.cancel_check = check if cancel_when else None
    try:
        while True:
            for c in engine.step():
                if c.request_id == rid:
                    engine.check_integrity()
                    return c
    finally:
        engine.cancel_check = None


def fresh(engine: Engine, params):
    out = run(engine, params, salt="fresh-run")  # another salt: no cache hit possible
    assert out.cached_tokens == 0
    return out


def computed(n: int):
    return lambda lane: lane.num_computed >= n


def assert_resumed_equals_fresh(model_dir, seeded: bool) -> None:
    """cancel_prefill at 3 blocks on `model_dir`'s engine keeps them; the retry continues from
    them and equals a fresh run, tokens and logprobs (the other families' tests use this)."""
    engine = build_engine(str(model_dir), EngineConfig(block_size=BS, prefill_chunk=BS))
    params = SEEDED if seeded else GREEDY
    assert run(engine, params, cancel_when=computed(3 * BS)).finish_reason == "cancelled"
    retry = run(engine, params)
    assert retry.cached_tokens == 3 * BS
    ref = fresh(engine, params)
    assert (retry.token_ids, retry.logprobs) == (ref.token_ids, ref.logprobs)


def generated(n: int):
    return lambda lane: len(lane.output_ids) >= n


CASES = {
    "at-0-tokens": (lambda lane: True, 0),
    "block-boundary": (computed(2 * BS), 2 * BS),
    "mid-block-end-of-prompt": (computed(len(PROMPT)), 6 * BS),
    "after-decode-started": (generated(5), 6 * BS),
}


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_resumed_equals_fresh(engine, case, params):
    when, retained = CASES[case]
    cancelled = run(engine, params, cancel_when=when)
    assert cancelled.finish_reason == "cancelled"
    retry = run(engine, params)
    assert retry.cached_tokens == retained
    ref = fresh(engine, params)
    assert retry.token_ids == ref.token_ids
    assert retry.logprobs == ref.logprobs  # bitwise
    if case == "after-decode-started":
        assert cancelled.token_ids == ref.token_ids[: len(cancelled.token_ids)]  # nothing lost


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_repeated_cancellations_accumulate(engine, params):
    retained = []
    for _ in range(3):  # each attempt computes one more block past its cache hit, then stops
        attempt = {}

        def one_more_block(lane: Lane, attempt=attempt) -> bool:
            attempt.setdefault("start", lane.num_computed)
            return lane.num_computed >= attempt["start"] + BS

        out = run(engine, params, cancel_when=one_more_block)
        retained.append(out.cached_tokens)
    retry = run(engine, params)
    assert retained == [0, BS, 2 * BS]
    assert retry.cached_tokens == 3 * BS
    ref = fresh(engine, params)
    assert (retry.token_ids, retry.logprobs) == (ref.token_ids, ref.logprobs)


def test_negative_control_no_publication_on_cancel(engine):
    """Without publishing on cancel, nothing is kept: the retry finds no cached tokens."""
    engine.scheduler.publish = lambda lane: None
    run(engine, GREEDY, cancel_when=computed(4 * BS))
    assert run(engine, GREEDY).cached_tokens == 0


def test_negative_control_other_salt_gets_no_hit(engine):
    run(engine, GREEDY, cancel_when=computed(4 * BS))
    assert run(engine, GREEDY, salt="someone-else").cached_tokens == 0
    assert run(engine, GREEDY).cached_tokens == 4 * BS


def publishing_early(scheduler):
    """The bug class the design forbids: publishing a round's blocks when it is planned, before
    the forwards that write them have run."""
    plan = scheduler.plan

    def plan_and_publish(num_drafts):
        round_plan = plan(num_drafts)
        for step in round_plan.steps:
            lane, real = step.lane, step.lane.num_computed
            lane.num_computed = max(real, step.end)
            scheduler.publish(lane)
            lane.num_computed = real
        return round_plan

    scheduler.plan = plan_and_publish


def test_negative_control_publishing_before_the_forward_is_caught(llama_dir):
    """The resumed == fresh check above detects blocks published before their KV exists."""
    engine = build_engine(str(llama_dir), EngineConfig(block_size=BS, prefill_chunk=BS))
    publishing_early(engine.scheduler)
    run(engine, GREEDY, cancel_when=computed(BS))  # the round's later forwards never run
    retry = run(engine, GREEDY)
    assert retry.cached_tokens == 6 * BS  # the bogus blocks were found ...
    ref = fresh(engine, GREEDY)
    assert retry.logprobs != ref.logprobs  # ... and the equality check fails on them


def test_cancel_by_id_between_rounds(engine):
    a = engine.add_request(PROMPT, GREEDY)
    b = engine.add_request(PROMPT[:40], GREEDY)
    engine.step()
    engine.cancel(a)
    ended = engine.step()
    assert [(c.request_id, c.finish_reason) for c in ended] == [(a, "cancelled")]
    while engine.has_work():
        for c in engine.step():
            assert c.request_id == b and c.finish_reason == "length"
    engine.check_integrity()
    engine.cancel(12345)  # unknown ids are ignored
    assert engine.step() == []
