"""A failure while handling one request fails that request alone: injected at every stage of a
round, the poisoned requests get a 5xx in OpenAI's error shape, every other request in the same
rounds gets its solo output, no block leaks, and the engine keeps serving."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

import lanes.scheduler
import lanes.verifier
from lanes import Engine, EngineConfig, SamplingParams, build_engine
from tests.live_server import MODEL, LiveServer

POISON_SEED = 666
POISON_TEXT = "POISON"
CONFIG = EngineConfig(drafter="ngram", prefill_chunk=32)
PROMPTS = [[11 + i, 12, 13, 14] * (6 + 3 * i) for i in range(6)]


def _poisoned(lanes_or_steps) -> bool:
    return any(getattr(x, "lane", x).params.seed == POISON_SEED for x in lanes_or_steps)


class Injector:
    """Raises RuntimeError in one stage whenever a poisoned request is part of it."""

    def __init__(self) -> None:
        self.fired = 0

    def fire(self, error: type[Exception] = RuntimeError) -> None:
        self.fired += 1
        raise error("injected failure")

    def install(self, stage: str, engine: Engine, monkeypatch) -> None:
        if stage == "submit":
            encode = engine.tokenizer.encode

            def bad_encode(text, *a, **kw):
                if POISON_TEXT in text:
                    self.fire(TypeError)  # what tokenizers raised for a lone surrogate
                return encode(text, *a, **kw)

            monkeypatch.setattr(engine.tokenizer, "encode", bad_encode)
        elif stage == "plan":
            plan_round = lanes.scheduler.plan_round

            def bad_plan(running, *a, **kw):
                if _poisoned(running):
                    self.fire()
                return plan_round(running, *a, **kw)

            monkeypatch.setattr(lanes.scheduler, "plan_round", bad_plan)
        elif stage == "draft":
            self._wrap(monkeypatch, engine.proposer, "propose", lambda lanes, *a: _poisoned(lanes))
        elif stage == "forward":
            # the runner names lanes by slot (lanes.lane_rows): poisoned if a poisoned lane's is
            self._wrap(
                monkeypatch,
                engine.runner,
                "execute",
                lambda rows, **kw: _poisoned(
                    [x for x in engine.running if x.slot in {r.slot for r in rows}]
                ),
            )
        elif stage == "sample":
            verify = lanes.verifier.verify

            def bad_verify(mode, rows, drafts, draft_lp, params, *rest):
                if params.seed == POISON_SEED:
                    self.fire()
                return verify(mode, rows, drafts, draft_lp, params, *rest)

            monkeypatch.setattr(lanes.verifier, "verify", bad_verify)
        elif stage == "output":
            self._wrap(monkeypatch, engine.output, "append", lambda lane, *a: _poisoned([lane]))
        else:
            raise ValueError(stage)

    def _wrap(self, monkeypatch, owner, name, poisoned) -> None:
        original = getattr(owner, name)

        def wrapped(*args, **kw):
            if poisoned(*args, **kw):
                self.fire()
            return original(*args, **kw)

        monkeypatch.setattr(owner, name, wrapped)


@pytest.fixture(scope="module")
def solo(long_model_dir) -> list[str]:
    """Each normal request's text, run alone on a clean engine."""
    engine = build_engine(str(long_model_dir), CONFIG)
    return [engine.generate([p], _params(i))[0].text for i, p in enumerate(PROMPTS)]


def _params(seed: int) -> SamplingParams:
    return SamplingParams(max_tokens=12, temperature=0.7, seed=seed, ignore_eos=True)


def _body(prompt, seed: int) -> dict:
    return {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": 12,
        "temperature": 0.7,
        "seed": seed,
        "ignore_eos": True,
    }


@pytest.mark.parametrize("stage", ["submit", "plan", "draft", "forward", "sample", "output"])
def test_failure_fails_only_its_request(stage, long_model_dir, solo, monkeypatch):
    engine = build_engine(str(long_model_dir), CONFIG)
    injector = Injector()
    injector.install(stage, engine, monkeypatch)
    poison = [
        _body(f"{POISON_TEXT} one" if stage == "submit" else PROMPTS[0], POISON_SEED),
        _body(f"{POISON_TEXT} two" if stage == "submit" else PROMPTS[3], POISON_SEED),
    ]
    normal = [_body(p, i) for i, p in enumerate(PROMPTS)]
    with LiveServer(engine) as live:
        with ThreadPoolExecutor(8) as pool:
            # poisoned requests interleaved with normal ones, so they share rounds and forwards
            bodies = normal[:3] + poison[:1] + normal[3:] + poison[1:]
            replies = list(pool.map(lambda b: live.post("/v1/completions", b), bodies))
        kv = live.wait_idle()
        health = json.loads(live.get("/health"))
        after = live.post("/v1/completions", _body(PROMPTS[1], 1))
    assert injector.fired >= 2
    texts = []
    for body, (status, raw) in zip(bodies, replies, strict=True):
        reply = json.loads(raw)
        if body["seed"] == POISON_SEED:
            assert status == 500 and reply["error"]["type"] == "server_error", reply
            assert "injected" not in reply["error"]["message"]  # details stay in the log
        else:
            assert status == 200, reply
            texts.append(reply["choices"][0]["text"])
    assert texts == solo
    assert kv["integrity"] == "ok" and kv["blocks_owned_by_lanes"] == 0
    assert kv["blocks_free"] + kv["blocks_cached"] == kv["blocks_total"]
    assert kv["failed_requests"] == (0 if stage == "submit" else 2)
    assert health == {"status": "ok"}
    assert after[0] == 200 and json.loads(after[1])["choices"][0]["text"] == solo[1]


def test_forward_failure_retries_lanes_alone(long_model_dir, solo, monkeypatch):
    """Engine level: a forward that raises for a batch is rerun one lane at a time; the healthy
    lanes' tokens equal their solo tokens (batch invariance), the poisoned lane ends "error"."""
    # one 256-token chunk holds all four prompts: the poisoned lane shares its forward
    engine = build_engine(str(long_model_dir), CONFIG.replace(prefill_chunk=256))
    injector = Injector()
    injector.install("forward", engine, monkeypatch)
    params = [_params(i) for i in range(3)] + [_params(POISON_SEED)]
    out = engine.generate(PROMPTS[:3] + [PROMPTS[3]], params)
    assert [o.text for o in out[:3]] == solo[:3]
    assert out[3].finish_reason == "error" and out[3].error == "RuntimeError"
    assert injector.fired >= 2  # the batch, then the poisoned lane alone
    engine.check_integrity()
    assert not engine.running and not engine.waiting
