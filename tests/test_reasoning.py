"""Reasoning apart from the answer (lanes/reasoning.py): a whole output and the same output
streamed in any pieces split the same way, for both shapes of thinking templates; over HTTP the
message carries reasoning_content, drafted or not."""

from __future__ import annotations

import random

import pytest

from lanes import build_engine
from lanes.reasoning import ReasoningStream, split_reasoning
from tests.live_server import LiveServer

CASES = [
    ("<think>\nplan a b\n</think>\n\nThe answer.", False, ("\nplan a b\n", "The answer.")),
    ("plan a b\n</think>\n\nThe answer.", True, ("plan a b\n", "The answer.")),
    ("No thinking here.", False, (None, "No thinking here.")),
    ("<think>cut off mid-tho", False, ("cut off mid-tho", "")),
    ("  <think>x</think>y", False, ("x", "y")),
    ("a </think> in the answer", False, (None, "a </think> in the answer")),
]


@pytest.mark.parametrize("text, inside, expected", CASES)
def test_whole_outputs_split(text, inside, expected):
    assert split_reasoning(text, inside) == expected


@pytest.mark.parametrize("text, inside, expected", CASES)
def test_streams_split_like_whole_outputs_in_any_pieces(text, inside, expected):
    rng = random.Random(7)
    for _ in range(50):
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 6))))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        stream, reasoning, content = ReasoningStream(inside), "", ""
        for piece in [*pieces, None]:
            r, c = stream.flush() if piece is None else stream.feed(piece)
            reasoning, content = reasoning + r, content + c
        want_reasoning, want_content = expected
        assert (reasoning, content) == (want_reasoning or "", want_content), pieces


def test_negative_control_a_stream_without_holding_tags_breaks_them():
    """Fed one character at a time, a stream that passed text through at once would emit
    '</thi' as reasoning; this one holds the cut tag."""
    stream = ReasoningStream(inside=True)
    out = [stream.feed(ch) for ch in "ab</think>c"]
    assert "".join(r for r, _ in out) == "ab" and "".join(c for _, c in out) == "c"
    assert all("<" not in r for r, _ in out)


THINKING = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
    "{# </think> closes it #}"
)


def test_a_thinking_template_gives_reasoning_content_drafted_or_not(llama_dir):
    """A template whose prompt opens <think>: the output until a </think> it never writes (a
    tiny random model) is reasoning; with --reasoning-parser none it stays content."""
    engine = build_engine(str(llama_dir))
    engine.tokenizer.chat_template = THINKING
    body = {"ignore_eos": True}
    msgs = [{"role": "user", "content": "hi"}]
    with LiveServer(engine) as live:
        c = live.client()
        outs = [c.chat.completions.create(model="tiny", messages=msgs, max_tokens=8,
                                          temperature=0, extra_body={**body, "draft": d})
                for d in (True, False)]  # fmt: skip
        streamed = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=8,
                                             temperature=0, stream=True, extra_body=body)  # fmt: skip
        pieces = [ch.choices[0].delta.model_dump() for ch in streamed if ch.choices]
    for out in outs:
        message = out.choices[0].message.model_dump()
        assert message["content"] == "" and message["reasoning_content"]
    assert outs[0].choices[0].message.model_dump() == outs[1].choices[0].message.model_dump()
    streamed_reasoning = "".join(p.get("reasoning_content") or "" for p in pieces)
    assert streamed_reasoning == outs[0].choices[0].message.model_dump()["reasoning_content"]
    with LiveServer(engine, reasoning_parser="none") as live:
        plain = live.client().chat.completions.create(
            model="tiny", messages=msgs, max_tokens=8, temperature=0, extra_body=body
        )
    message = plain.choices[0].message.model_dump()
    assert message["content"] == outs[0].choices[0].message.model_dump()["reasoning_content"]
    assert message.get("reasoning_content") is None
