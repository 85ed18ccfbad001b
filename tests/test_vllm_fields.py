"""vLLM's request fields on the engine: bad words and allowed tokens are logits processing, exact
under drafting (with the negative control that drops the drafts from a row's history), a stop
string can stay in the text, a prompt can be cut to its last tokens, chat templates read extra
names, and an unknown field is logged once."""

from __future__ import annotations

import logging

import pytest

import lanes.chat
from lanes import SamplingParams, build_engine
from lanes.chat import render_chat
from lanes.penalties import banned_by_words
from tests.live_server import LiveServer
from tests.replay_drafts import NoDraftsInHistory, drafted_and_plain

PROMPTS = ["The quick brown fox", "Once upon a time there", "one two three one two"]


def test_a_bad_word_is_banned_where_the_output_ends_with_its_other_tokens():
    words = [(7,), (4, 5, 6)]
    assert banned_by_words(words, [1, 4, 5]) == [7, 6]
    assert banned_by_words(words, [4, 5, 9]) == [7]
    assert banned_by_words(words, [5]) == [7]  # too short for the long word's prefix
    assert banned_by_words([(4, 5, 6)], []) == []


def _bad_words_and_allowed(engine, free):
    """Bad words: the first word the model wrote; allowed: the tokens it chose plus a few."""
    word = engine.tokenizer.decode(free.token_ids[1:2]).strip() or "the"
    allowed = tuple(sorted(set(free.token_ids) | set(range(40, 60))))
    return word, allowed


@pytest.mark.parametrize("sampling", [{}, dict(temperature=0.8, seed=3)], ids=["greedy", "seeded"])
def test_banned_and_allowed_tokens_keep_drafted_equal_to_undrafted(llama_dir, sampling):
    engine = build_engine(str(llama_dir))
    free = engine.generate(PROMPTS[:1], SamplingParams(max_tokens=12, ignore_eos=True))[0]
    word, allowed = _bad_words_and_allowed(engine, free)
    params = SamplingParams(max_tokens=12, ignore_eos=True, bad_words=(word,),
                            allowed_token_ids=allowed, **sampling)  # fmt: skip
    drafted, plain = drafted_and_plain(engine, PROMPTS, params)
    banned = engine.intake.bad_words_ids((word,))
    for d, p in zip(drafted, plain, strict=True):
        assert (d.token_ids, d.logprobs) == (p.token_ids, p.logprobs)
        assert set(p.token_ids) <= set(allowed)
        for ids in banned:
            n = len(ids)
            assert all(tuple(p.token_ids[i : i + n]) != ids for i in range(len(p.token_ids)))
    assert sum(d.num_drafted - d.num_accepted for d in drafted) > 0  # drafts were rejected too


def test_negative_control_bad_words_judged_without_the_drafts_before_a_row(llama_dir):
    """A multi-token bad word whose prefix sits in a row's drafts: judged on the output alone,
    drafted output differs from undrafted."""
    engine = build_engine(str(llama_dir))
    free = engine.generate(PROMPTS, SamplingParams(max_tokens=12, ignore_eos=True))
    # bad "words" made of each output's own token pairs, so their prefixes show up in drafts
    pairs = {tuple(c.token_ids[i : i + 2]) for c in free for i in range(1, 11, 3)}
    control = build_engine(str(llama_dir), engine_type=NoDraftsInHistory)
    params = SamplingParams(max_tokens=12, ignore_eos=True, bad_words_ids=tuple(sorted(pairs)))
    drafted, plain = drafted_and_plain(control, PROMPTS, params)
    assert any(d.token_ids != p.token_ids for d, p in zip(drafted, plain, strict=True))


def test_the_stop_string_can_stay_in_the_text(llama_dir):
    engine = build_engine(str(llama_dir))
    free = engine.generate(PROMPTS[:1], SamplingParams(max_tokens=16, ignore_eos=True))[0]
    stop = free.text[3:6]
    kept, cut = (
        engine.generate(PROMPTS[:1], SamplingParams(max_tokens=16, ignore_eos=True, stop=(stop,),
                                                    include_stop_str_in_output=keep))[0]
        for keep in (True, False)
    )  # fmt: skip
    at = free.text.index(stop)
    assert (kept.text, cut.text) == (free.text[: at + len(stop)], free.text[:at])


def test_a_prompt_cut_to_its_last_tokens_is_that_prompt(llama_dir):
    engine = build_engine(str(llama_dir))
    ids = engine.encode(PROMPTS[1])
    cut = engine.generate([PROMPTS[1]], SamplingParams(max_tokens=6, truncate_prompt_tokens=3))[0]
    tail = engine.generate([ids[-3:]], SamplingParams(max_tokens=6))[0]
    assert cut.prompt_ids == ids[-3:] and cut.token_ids == tail.token_ids


def test_chat_templates_read_extra_names():
    template = (
        "{% for m in messages %}{{ m['content'] }}{% endfor %}"
        "{% if enable_thinking is defined and not enable_thinking %}<no-think>{% endif %}"
        "{{ payload | tojson(indent=2, sort_keys=True) }}"
    )
    messages = [{"role": "user", "content": "hi"}]
    text = render_chat(template, messages, template_kwargs={"enable_thinking": False,
                                                            "payload": {"b": 1, "a": "é"}})  # fmt: skip
    assert text == 'hi<no-think>{\n  "a": "é",\n  "b": 1\n}'
    assert "<no-think>" not in render_chat(template, messages, template_kwargs={"payload": 1})


def test_an_unknown_field_is_logged_once(llama_dir, caplog):
    engine = build_engine(str(llama_dir))
    with LiveServer(engine) as live, caplog.at_level(logging.WARNING, logger="lanes"):
        c = live.client()
        for _ in range(2):
            c.completions.create(model="tiny", prompt="hi", max_tokens=2,
                                 extra_body={"frobnicate": 1, "stop_token_ids": [5]})  # fmt: skip
    said = [r.getMessage() for r in caplog.records if "frobnicate" in r.getMessage()]
    assert said == ["request field 'frobnicate' is not known to lanes and was ignored"]


def test_echoed_prompt_logprobs_are_the_logprobs_decoding_gives(llama_dir):
    """The logprob echo reports for a prompt token equals the one the engine gave that token when
    it generated it (prefill and decode give a position the same bits), drafted or not."""
    engine = build_engine(str(llama_dir))
    ids = engine.encode(PROMPTS[0])
    params = SamplingParams(max_tokens=5, ignore_eos=True)
    drafted, plain = drafted_and_plain(engine, [ids], params)
    with LiveServer(engine) as live:
        c = live.client()
        full = ids + plain[0].token_ids
        out = c.completions.create(model="tiny", prompt=full, max_tokens=0, logprobs=1, echo=True)
        whole = c.completions.create(model="tiny", prompt=ids, max_tokens=5, logprobs=1, temperature=0,
                                     echo=True, extra_body={"ignore_eos": True})  # fmt: skip
    echoed = out.choices[0].logprobs.token_logprobs
    assert echoed[0] is None and len(echoed) == len(full)
    assert echoed[len(ids) :] == plain[0].logprobs == drafted[0].logprobs
    assert out.usage.completion_tokens == 0 and out.choices[0].finish_reason == "length"
    assert whole.choices[0].logprobs.token_logprobs == echoed  # the prompt, then the tokens
    assert whole.choices[0].text == out.choices[0].text


def test_prompt_logprobs_rank_and_name_each_prompt_token(llama_dir):
    engine = build_engine(str(llama_dir))
    with LiveServer(engine) as live:
        out = live.client().completions.create(
            model="tiny", prompt="hello there", max_tokens=1, extra_body={"prompt_logprobs": 2}
        )
    scored = out.model_dump()["choices"][0]["prompt_logprobs"]
    ids = engine.encode("hello there")
    assert scored[0] is None and len(scored) == len(ids)
    for pos, entry in enumerate(scored[1:], start=1):
        assert str(ids[pos]) in entry  # the prompt's own token, with its rank
        best = [v for v in entry.values() if v["rank"] == 1]
        assert best and all(v["logprob"] <= best[0]["logprob"] for v in entry.values())


def test_documents_reach_the_chat_template(llama_dir):
    """vLLM's `documents` (retrieval templates' sources) are the template's `documents`."""
    import openai

    engine = build_engine(str(llama_dir))
    engine.tokenizer.chat_template = (
        "{% for d in documents or [] %}[{{ d['title'] }}: {{ d['text'] }}]{% endfor %}"
        "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    )
    docs = [{"title": "Paris", "text": "capital of France"}]
    ids = engine.encode(lanes.chat.Chat([{"role": "user", "content": "hi"}], None,
                                        {"documents": docs}))  # fmt: skip
    assert engine.tokenizer.decode(ids) == "[Paris: capital of France]hi"
    with LiveServer(engine) as live:
        c = live.client()
        out = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                        max_tokens=2, extra_body={"documents": docs})  # fmt: skip
        assert out.usage.prompt_tokens == len(ids)
        with pytest.raises(openai.BadRequestError, match="documents"):
            c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}],
                                      extra_body={"documents": "not a list"})  # fmt: skip
