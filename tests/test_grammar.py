"""Structured outputs (lanes/grammar.py): the output matches its JSON schema, regex or choices,
and the equalities hold under a grammar — drafted == draft: false (drafts the grammar forbids are
rejected; negative control: rows masked without the drafts before them) and concurrent == solo,
greedy and seeded. Negative control for the schema test: a sampler that ignores the mask."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from lanes import EngineConfig, SamplingParams, build_engine
from lanes.grammar import Grammar
from tests.replay_drafts import NoDraftsInHistory, drafted_and_plain

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "tags": {
            "type": "array",
            "items": {"enum": ["alpha", "beta", "gamma"]},
            "minItems": 3,
            "maxItems": 5,
        },
        "n": {"type": "integer", "minimum": 0, "maximum": 999},
    },
    "required": ["name", "tags", "n"],
    "additionalProperties": False,
}
PROMPTS = ["one two three one two three", "Paris is the capital of France; Berlin is", "fox"]
SEEDED = dict(temperature=0.9, seed=11)
GBNF = 'root ::= ("ab" | "cd") digit digit? digit? ";"\ndigit ::= [0-9]'
GBNF_AS_LARK = 'start: ("ab" | "cd") DIGIT DIGIT? DIGIT? ";"\nDIGIT: /[0-9]/'


def _matches_schema(text: str) -> bool:
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return (
        isinstance(value, dict)
        and set(value) == {"name", "tags", "n"}
        and isinstance(value["name"], str)
        and len(value["name"]) <= 12
        and 3 <= len(value["tags"]) <= 5
        and set(value["tags"]) <= {"alpha", "beta", "gamma"}
        and isinstance(value["n"], int)
        and 0 <= value["n"] <= 999
    )


def _text(engine, completion) -> str:
    return engine.tokenizer.decode(completion.token_ids)


@pytest.mark.parametrize("sampling", [{}, SEEDED], ids=["greedy", "seeded"])
def test_outputs_match_their_grammar(tiny_models, sampling):
    path, _ = tiny_models["llama"]
    engine = build_engine(str(path))
    params = SamplingParams(max_tokens=80, grammar=Grammar.json_schema(SCHEMA), **sampling)
    for out in engine.generate(PROMPTS, params):
        assert out.finish_reason == "stop" and _matches_schema(_text(engine, out)), out
    regex = Grammar("regex", r"[0-9]{3}-[a-c]+\.")
    for out in engine.generate(PROMPTS, dataclasses.replace(params, grammar=regex)):
        assert re.fullmatch(r"[0-9]{3}-[a-c]+\.", _text(engine, out)), _text(engine, out)
    choices = ["red", "green", "blue (dark)"]
    choice = dataclasses.replace(params, grammar=Grammar.choice(choices))
    assert all(_text(engine, o) in choices for o in engine.generate(PROMPTS, choice))
    # a request's grammar, in GBNF (llama.cpp's) and in Lark
    for source in (GBNF, GBNF_AS_LARK):
        grammar = dataclasses.replace(params, grammar=Grammar("grammar", source))
        for out in engine.generate(PROMPTS, grammar):
            assert re.fullmatch(r"(ab|cd)[0-9]{1,3};", _text(engine, out)), (source, out)


def test_past_the_grammars_end_only_eos(tiny_models):
    """ignore_eos keeps a finished grammar's lane going: each further row allows only EOS (a
    row with nothing allowed would have no distribution to sample)."""
    path, _ = tiny_models["llama"]
    engine = build_engine(str(path))
    params = SamplingParams(max_tokens=12, ignore_eos=True, grammar=Grammar.choice(["red"]))
    for sampling in ({}, SEEDED):
        (out,) = engine.generate(["fox"], dataclasses.replace(params, **sampling))
        ids = out.token_ids
        assert engine.tokenizer.decode(ids) == "red" and out.finish_reason == "length"
        assert len(ids) == 12 and set(ids[-8:]) <= engine.eos_token_ids


def test_negative_control_a_sampler_that_ignores_the_mask(tiny_models, monkeypatch):
    """Without the mask the same model writes no valid JSON: the schema test can fail."""
    monkeypatch.setattr("lanes.verifier.apply_mask", lambda row, allowed: row)
    path, _ = tiny_models["llama"]
    engine = build_engine(str(path))
    params = SamplingParams(max_tokens=80, grammar=Grammar.json_schema(SCHEMA))
    assert not any(_matches_schema(_text(engine, o)) for o in engine.generate(PROMPTS, params))


def test_a_bad_grammar_is_the_requests_error(tiny_models):
    path, _ = tiny_models["llama"]
    engine = build_engine(str(path))
    with pytest.raises(ValueError, match="regex is not valid"):
        engine.make_lane("fox", SamplingParams(grammar=Grammar("regex", "[0-9")))
    with pytest.raises(ValueError, match="json_schema is not valid"):
        engine.make_lane("fox", SamplingParams(grammar=Grammar.json_schema({"type": "bogus"})))
    for bad in ("root ::= (", "start: undefined_rule", "no rules"):
        with pytest.raises(ValueError, match="grammar is not valid"):
            engine.make_lane("fox", SamplingParams(grammar=Grammar("grammar", bad)))
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(min_tokens=2, grammar=Grammar("regex", "a+"))
    (out,) = engine.generate(["fox"], SamplingParams(max_tokens=4))  # and it goes on
    assert out.token_ids


@pytest.mark.parametrize("sampling", [{}, SEEDED], ids=["greedy", "seeded"])
def test_drafted_equals_undrafted_under_a_grammar(tiny_models, sampling):
    path, _ = tiny_models["llama"]
    engine = build_engine(str(path), EngineConfig(num_draft_tokens=4, adaptive_drafts=False))
    params = SamplingParams(max_tokens=80, grammar=Grammar.json_schema(SCHEMA), **sampling)
    drafted, plain = drafted_and_plain(engine, PROMPTS, params)
    assert sum(d.num_accepted for d in drafted) > 0
    assert sum(d.num_drafted - d.num_accepted for d in drafted) > 0
    for d, p in zip(drafted, plain, strict=True):
        assert (d.token_ids, d.logprobs) == (p.token_ids, p.logprobs)


def test_negative_control_masks_that_ignore_the_drafts_before_them(tiny_models):
    path, _ = tiny_models["llama"]
    cfg = EngineConfig(num_draft_tokens=4, adaptive_drafts=False)
    engine = build_engine(str(path), cfg, engine_type=NoDraftsInHistory)
    params = SamplingParams(max_tokens=80, grammar=Grammar.json_schema(SCHEMA))
    drafted, plain = drafted_and_plain(engine, PROMPTS, params)
    assert any(d.token_ids != p.token_ids for d, p in zip(drafted, plain, strict=True))


@pytest.mark.parametrize("sampling", [{}, SEEDED], ids=["greedy", "seeded"])
def test_concurrent_equals_solo_under_a_grammar(tiny_models, sampling):
    path, _ = tiny_models["llama"]
    engine = build_engine(str(path))
    params = SamplingParams(max_tokens=80, grammar=Grammar.json_schema(SCHEMA), **sampling)
    together = engine.generate(PROMPTS, params)
    for prompt, out in zip(PROMPTS, together, strict=True):
        (solo,) = engine.generate([prompt], params, cache_salt="solo")
        assert (solo.token_ids, solo.logprobs) == (out.token_ids, out.logprobs)
