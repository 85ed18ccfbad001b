"""Logits processing batched on the device (lanes.penalties.process_rows): with the Triton
kernels (interpreted on the CPU, native on a GPU), lanes with a grammar or penalties have their
rows processed in one batch and sampled in one launch, not row by row on the host. The
equalities hold on that path (drafted == draft: false, concurrent == solo; negative control:
rows processed without the drafts before them), its tokens are the host path's, and
process_rows gives a row the bits process_logits gives it alone."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from lanes import EngineConfig, SamplingParams, build_engine
from lanes.engine import Engine
from lanes.grammar import Grammar
from lanes.penalties import RowContext, process_logits, process_rows
from tests.replay_drafts import NoDraftsInHistory, drafted_and_plain

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
PROMPTS = ["one two three one two three", "fox"]
REGEX = Grammar("regex", r"(ab|cd)[0-9]{2,3}; (yes|no)")
PENALTIES = dict(
    presence_penalty=0.6, frequency_penalty=0.4, repetition_penalty=1.3, min_p=0.02,
    logit_bias=((5, 3.0),), min_tokens=3,
)  # fmt: skip
SEEDED = dict(temperature=0.8, top_p=0.9, seed=5)


def _engine(tiny_models, engine_type=Engine, **config):
    cfg = EngineConfig(kernels="triton", device=DEVICE, cost_aware_drafts=False, **config)
    engine = build_engine(str(tiny_models["llama"][0]), cfg, engine_type=engine_type)
    assert engine.ops.name == "triton"
    return engine


def _counted(engine, monkeypatch) -> dict[str, int]:
    """Counts of batched processing calls and of host-path verifications."""
    import lanes.verifier

    counts = {"batched": 0, "host": 0}
    batched, host = lanes.verifier.process_rows, engine.verifier.verify_on_host

    def count_batched(*a):
        counts["batched"] += 1
        return batched(*a)

    def count_host(*a):
        counts["host"] += 1
        return host(*a)

    monkeypatch.setattr(lanes.verifier, "process_rows", count_batched)
    monkeypatch.setattr(engine.verifier, "verify_on_host", count_host)
    return counts


def test_a_row_processed_in_a_batch_has_its_bits_alone():
    gen = torch.Generator().manual_seed(2)
    vocab = 96
    logits = torch.randn((6, vocab), generator=gen) * 3
    allowed = torch.rand(vocab, generator=gen) > 0.5
    rows = [
        RowContext(SamplingParams(**PENALTIES, **SEEDED), [1, 2, 3], [7, 7, 9], frozenset({0})),
        RowContext(SamplingParams(), [4], [], frozenset(), allowed),
        RowContext(SamplingParams(repetition_penalty=0.7), [5, 6], [6, 8], frozenset({2})),
        RowContext(SamplingParams(min_tokens=2, logit_bias=((3, -1.5),)), [], [1], frozenset({3})),
        RowContext(SamplingParams(allowed_token_ids=(1, 5, 90), min_p=0.1, **SEEDED), [], [],
                   frozenset()),
        RowContext(SamplingParams(bad_words_ids=((4,), (8, 9), (7, 8, 2))), [], [7, 8],
                   frozenset()),
    ]  # fmt: skip
    batched = process_rows(logits, rows)
    for i, r in enumerate(rows):
        row = logits[i].clone()
        if r.allowed is not None:
            row = row.masked_fill(~r.allowed, float("-inf"))
        alone = process_logits(row, r.params, r.prompt_ids, r.output_ids, r.stop_ids)
        assert torch.equal(batched[i], alone), i
        assert torch.equal(process_rows(logits[i : i + 1], [r])[0], batched[i]), i


@pytest.mark.parametrize(
    "fields",
    [
        dict(grammar=REGEX),
        dict(**PENALTIES, **SEEDED),
        dict(allowed_token_ids=tuple(range(3, 60)), bad_words_ids=((9,), (12, 13)), **SEEDED),
    ],
    ids=["grammar-greedy", "penalties-seeded", "bans-seeded"],
)
def test_drafted_equals_undrafted_batched_on_the_device(tiny_models, monkeypatch, fields):
    engine = _engine(tiny_models, num_draft_tokens=3, adaptive_drafts=False)
    counts = _counted(engine, monkeypatch)
    params = SamplingParams(max_tokens=10, ignore_eos=True, **fields)
    drafted, plain = drafted_and_plain(engine, PROMPTS, params)
    assert counts["batched"] > 0 and counts["host"] == 0
    assert sum(d.num_drafted - d.num_accepted for d in drafted) > 0
    for d, p in zip(drafted, plain, strict=True):
        assert (d.token_ids, d.logprobs) == (p.token_ids, p.logprobs)
    together = engine.generate(PROMPTS, dataclasses.replace(params, draft=False), cache_salt="b")
    for t, p in zip(together, plain, strict=True):
        assert (t.token_ids, t.logprobs) == (p.token_ids, p.logprobs)
    if "grammar" in fields:
        import re

        for p in plain:
            text = engine.tokenizer.decode(p.token_ids)
            assert re.fullmatch(r"(ab|cd)[0-9]{2,3}; (yes|no)", text), text
    # the host path's tokens (its logprobs from another sampler: equal to 1e-5)
    monkeypatch.setattr(engine.verifier, "processed_on_device", lambda params: False)
    on_host = engine.generate(PROMPTS, dataclasses.replace(params, draft=False), cache_salt="h")
    assert counts["host"] > 0
    for h, p in zip(on_host, plain, strict=True):
        assert h.token_ids == p.token_ids
        torch.testing.assert_close(h.logprobs, p.logprobs, rtol=1e-5, atol=1e-5)


def test_negative_control_batched_rows_without_the_drafts_before_them(tiny_models):
    engine = _engine(tiny_models, NoDraftsInHistory, num_draft_tokens=3, adaptive_drafts=False)
    params = SamplingParams(max_tokens=10, ignore_eos=True, **PENALTIES)
    drafted, plain = drafted_and_plain(engine, PROMPTS, params)
    assert any(
        (d.token_ids, d.logprobs) != (p.token_ids, p.logprobs)
        for d, p in zip(drafted, plain, strict=True)
    )


def test_the_samplers_compile_from_an_engines_runner(tiny_models):
    """lanes/warmup.py compiles the sampling kernels when a GPU engine is built, from the runner
    alone (before issue 40's split was checked on a GPU, this read an attribute the decoder no
    longer had, and every GPU engine logged a failed warm-up)."""
    from lanes.warmup import compile_samplers

    compile_samplers(_engine(tiny_models).runner)
