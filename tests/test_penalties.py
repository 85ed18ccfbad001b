"""Penalties, logit_bias, min_p and min_tokens (lanes/penalties.py): the arithmetic, against
transformers' repetition penalty, and the equalities — drafted == draft: false (each verify row
sees the drafts before it as output; negative control: rows that do not) and concurrent == solo."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from lanes import EngineConfig, SamplingParams, build_engine
from lanes.penalties import process_logits
from tests.replay_drafts import NoDraftsInHistory, drafted_and_plain

PROMPTS = ["one two three one two three", "Paris is the capital of France; Berlin is", "fox"]


def test_the_arithmetic():
    logits = torch.tensor([2.0, -1.0, 0.5, 3.0, 0.0])
    p = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)
    out = process_logits(logits, p, [4], [1, 1, 2], frozenset())
    assert out.tolist() == [2.0, -1.0 - 0.5 - 0.5, 0.5 - 0.5 - 0.25, 3.0, 0.0]
    p = SamplingParams(repetition_penalty=2.0)
    out = process_logits(logits, p, [0, 1], [3], frozenset())  # seen: 0, 1 (prompt), 3
    assert out.tolist() == [1.0, -2.0, 0.5, 1.5, 0.0]
    p = SamplingParams(logit_bias=((2, 10.0),), min_tokens=2, max_tokens=4)
    out = process_logits(logits, p, [], [7], frozenset({3}))  # 1 token so far: 3 held back
    assert out[2] == 10.5 and out[3] == float("-inf")
    assert process_logits(logits, p, [], [7, 8], frozenset({3}))[3] == 3.0  # 2 so far: free
    p = SamplingParams(temperature=0.5, min_p=0.1)
    out = process_logits(logits, p, [], [], frozenset())
    floor = 3.0 + 0.5 * math.log(0.1)  # p(t) / p_max >= 0.1 at T = 0.5
    assert out.isfinite().tolist() == [x >= floor for x in logits.tolist()]
    assert process_logits(logits, SamplingParams(), [1], [1], frozenset()) is logits  # neutral


def test_repetition_penalty_equals_transformers(tiny_models):
    path, hf = tiny_models["llama"]
    engine = build_engine(str(path))
    ids = engine.tokenizer.encode("one two three one two three one two")
    params = SamplingParams(max_tokens=24, ignore_eos=True, repetition_penalty=1.8)
    (out,) = engine.generate([ids], params)
    (plain,) = engine.generate([ids], dataclasses.replace(params, repetition_penalty=1.0))
    hf.generation_config.eos_token_id = None
    with torch.no_grad():
        ref = hf.generate(
            torch.tensor([ids]), max_new_tokens=24, do_sample=False, repetition_penalty=1.8,
            pad_token_id=0,
        )[0, len(ids) :].tolist()  # fmt: skip
    assert out.token_ids == ref and out.token_ids != plain.token_ids


def test_min_tokens_holds_back_eos_and_logit_bias_brings_it(tiny_models):
    path, _ = tiny_models["llama"]
    engine = build_engine(str(path))
    eos = min(engine.eos_token_ids)
    eager = SamplingParams(max_tokens=12, logit_bias=((eos, 100.0),))
    (first,) = engine.generate(["fox"], eager)
    assert first.token_ids == [eos] and first.finish_reason == "stop"
    (held,) = engine.generate(["fox"], dataclasses.replace(eager, min_tokens=5))
    assert len(held.token_ids) == 6 and held.token_ids[-1] == eos  # then EOS at once
    assert eos not in held.token_ids[:5]


SEEDED = dict(temperature=0.8, top_p=0.9, seed=5)


def _params(**sampling) -> SamplingParams:
    return SamplingParams(
        max_tokens=24, ignore_eos=True, presence_penalty=0.6, frequency_penalty=0.4,
        repetition_penalty=1.3, min_p=0.02, logit_bias=((5, 3.0),), **sampling,
    )  # fmt: skip


@pytest.mark.parametrize("sampling", [{}, SEEDED], ids=["greedy", "seeded"])
def test_drafted_equals_undrafted_with_penalties(tiny_models, sampling):
    path, _ = tiny_models["llama"]
    engine = build_engine(str(path), EngineConfig(num_draft_tokens=4, adaptive_drafts=False))
    drafted, plain = drafted_and_plain(engine, PROMPTS, _params(**sampling))
    assert sum(d.num_accepted for d in drafted) > 0
    assert sum(d.num_drafted - d.num_accepted for d in drafted) > 0
    for d, p in zip(drafted, plain, strict=True):
        assert (d.token_ids, d.logprobs) == (p.token_ids, p.logprobs)


def test_negative_control_rows_that_ignore_the_drafts_before_them(tiny_models):
    path, _ = tiny_models["llama"]
    cfg = EngineConfig(num_draft_tokens=4, adaptive_drafts=False)
    engine = build_engine(str(path), cfg, engine_type=NoDraftsInHistory)
    drafted, plain = drafted_and_plain(engine, PROMPTS, _params())
    # the equality above compares tokens and logprobs: without the drafts, they differ
    assert any(
        (d.token_ids, d.logprobs) != (p.token_ids, p.logprobs)
        for d, p in zip(drafted, plain, strict=True)
    )


@pytest.mark.parametrize("sampling", [{}, SEEDED], ids=["greedy", "seeded"])
def test_concurrent_equals_solo_with_penalties(tiny_models, sampling):
    path, _ = tiny_models["llama"]
    engine = build_engine(str(path))
    params = _params(**sampling)
    solo = [engine.generate([p], params)[0] for p in PROMPTS]
    batched = engine.generate(PROMPTS, params)
    for s, b in zip(solo, batched, strict=True):
        assert (b.token_ids, b.logprobs) == (s.token_ids, s.logprobs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("sampling", [{}, SEEDED], ids=["greedy", "seeded"])
def test_on_the_gpu_drafted_equals_undrafted_with_penalties(tiny_models, sampling):
    """The same on CUDA, where greedy lanes without penalties sample on the device and
    penalised ones must not: mixed in one batch, each keeps its own tokens."""
    path, _ = tiny_models["llama"]
    cfg = EngineConfig(device="cuda", num_draft_tokens=4, adaptive_drafts=False)
    engine = build_engine(str(path), cfg)
    drafted, plain = drafted_and_plain(engine, PROMPTS, _params(**sampling))
    for d, p in zip(drafted, plain, strict=True):
        assert (d.token_ids, d.logprobs) == (p.token_ids, p.logprobs)
    unpenalised = SamplingParams(max_tokens=24, ignore_eos=True)
    mixed = engine.generate(PROMPTS * 2, [_params(**sampling)] * 3 + [unpenalised] * 3)
    solo = [engine.generate([p], unpenalised)[0] for p in PROMPTS]
    assert [m.token_ids for m in mixed[:3]] == [p.token_ids for p in plain]
    assert [m.token_ids for m in mixed[3:]] == [s.token_ids for s in solo]
