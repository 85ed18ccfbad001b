"""Tokenizer, chat template, incremental detokenization, stop strings."""

from __future__ import annotations

import pytest

from lanes import SamplingParams, build_engine
from lanes.chat import ChatTemplateError, render_chat
from lanes.detokenize import IncrementalDetokenizer
from tests.conftest import CHATML


@pytest.fixture(scope="module")
def engine(llama_dir):
    return build_engine(str(llama_dir))


def test_streaming_multibyte_characters(engine):
    """Characters outside the tiny vocab split into byte tokens; the stream never shows half of
    one, and the pieces join to the full decode."""
    tok = engine.tokenizer
    text = "héllo 😀 wörld 中文 ok"
    ids = tok.encode(text)
    assert len(ids) > len(text.split())  # multi-byte characters really span several tokens
    detok = IncrementalDetokenizer(tok, prompt_ids=[])
    pieces = [detok.push(i) for i in ids]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == text == detok.text
    # a character split over tokens arrives whole, in one piece
    assert "😀" in pieces or any("😀" in p for p in pieces)


def test_flush_emits_an_incomplete_tail(engine):
    tok = engine.tokenizer
    ids = tok.encode("😀")
    detok = IncrementalDetokenizer(tok, prompt_ids=[])
    assert detok.push(ids[0]) == ""
    assert detok.flush() != ""


def test_stop_string_cuts_text(engine):
    (free,) = engine.generate(["The quick"], SamplingParams(max_tokens=24, ignore_eos=True))
    assert len(free.text) > 6
    stop = free.text[3:6]
    (cut,) = engine.generate(
        ["The quick"], SamplingParams(max_tokens=24, ignore_eos=True, stop=(stop,))
    )
    assert cut.finish_reason == "stop"
    assert cut.text == free.text[: free.text.index(stop)]
    assert cut.token_ids == free.token_ids[: len(cut.token_ids)]


def test_eos_and_stop_token_ids_stop_generation(llama_dir):
    engine = build_engine(str(llama_dir))
    params = SamplingParams(max_tokens=5, ignore_eos=True)
    (free,) = engine.generate(["The quick"], params)
    first = free.token_ids[0]
    (stopped,) = engine.generate(
        ["The quick"], SamplingParams(max_tokens=5, stop_token_ids=(first,))
    )
    assert stopped.token_ids == [first] and stopped.finish_reason == "stop"
    engine.output.eos_token_ids = frozenset({first})  # pretend the model's first pick is EOS
    (eos,) = engine.generate(["The quick"], SamplingParams(max_tokens=5))
    assert eos.token_ids == [first] and eos.finish_reason == "stop"
    assert engine.generate(["The quick"], params)[0].token_ids == free.token_ids  # ignore_eos


def test_chat_template_renders_and_encodes(engine):
    messages = [{"role": "user", "content": "hi"}]
    text = engine.tokenizer.apply_chat_template(messages)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    ids = engine.tokenizer.encode_chat(messages)
    im_start = engine.tokenizer.tk.token_to_id("<|im_start|>")
    assert ids[0] == im_start and ids.count(im_start) == 2


def test_chat_template_errors():
    with pytest.raises(ChatTemplateError, match="role"):
        render_chat(CHATML, [{"content": "no role"}])
    with pytest.raises(ChatTemplateError, match="no chat template"):
        render_chat(None, [{"role": "user", "content": "x"}])
    strict = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}"
    with pytest.raises(ChatTemplateError, match="user first"):
        render_chat(strict, [{"role": "assistant", "content": "x"}])
