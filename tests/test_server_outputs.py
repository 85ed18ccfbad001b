"""Structured outputs and tool calls over HTTP, as the OpenAI client sends them: the text
follows the schema, grammar or tool; bad ones are 400s and the server goes on."""

from __future__ import annotations

import json

import openai
import pytest

from tests.live_server import MODEL


@pytest.fixture(scope="module")
def server(long_model_server):
    return long_model_server


def test_structured_outputs(server):
    """response_format (json_schema, json_object), vLLM's structured_outputs and guided_*:
    the text matches; a bad schema or grammar is a 400 and the server goes on."""
    import re

    client = server.client()
    schema = {
        "type": "object",
        "properties": {
            "ok": {"type": "boolean"},
            "n": {"type": "integer", "minimum": 0, "maximum": 99},
        },
        "required": ["ok", "n"],
        "additionalProperties": False,
    }
    # bounded both ways, so the text closes within max_tokens (without a minimum a sampled
    # "-5896732454967923..." ran out of tokens in one CI run); seeded, so a run repeats
    chat = dict(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=40, seed=3)
    reply = client.chat.completions.create(
        **chat,
        response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": schema}},
    )
    value = json.loads(reply.choices[0].message.content)
    assert set(value) == {"ok", "n"} and isinstance(value["ok"], bool) and 0 <= value["n"] <= 99
    reply = client.chat.completions.create(**chat, response_format={"type": "json_object"})
    assert reply.choices[0].message.content.startswith("{")
    text = (
        client.completions.create(
            model=MODEL,
            prompt="x",
            max_tokens=8,
            extra_body={"structured_outputs": {"regex": "[0-9]{3}"}},
        )
        .choices[0]
        .text
    )
    assert re.fullmatch("[0-9]{3}", text), text
    text = (
        client.completions.create(
            model=MODEL, prompt="x", max_tokens=8, extra_body={"guided_choice": ["yes", "no"]}
        )
        .choices[0]
        .text
    )
    assert text in ("yes", "no")
    bad = {"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "bogus"}}}
    with pytest.raises(openai.BadRequestError, match="not valid"):
        client.chat.completions.create(**chat, response_format=bad)
    for grammar in ('root ::= ("yes" | "no") "!"', 'start: ("yes" | "no") "!"'):  # GBNF, Lark
        text = (
            client.completions.create(
                model=MODEL, prompt="x", max_tokens=8, extra_body={"guided_grammar": grammar}
            )
            .choices[0]
            .text
        )
        assert text in ("yes!", "no!"), (grammar, text)
    with pytest.raises(openai.BadRequestError, match="not valid"):
        client.completions.create(model=MODEL, prompt="x", extra_body={"guided_grammar": "a"})
    with pytest.raises(openai.BadRequestError, match="one structured output"):
        client.completions.create(
            model=MODEL, prompt="x", extra_body={"guided_regex": "a", "guided_choice": ["a"]}
        )
    assert client.completions.create(model=MODEL, prompt="x", max_tokens=2).choices[0].finish_reason


def test_tool_calls(server):
    """tools with tool_choice required: message.tool_calls (finish_reason tool_calls), streamed
    as tool_calls deltas (the header, then the arguments piece by piece); the follow-up turn with the call and its result is
    taken; tools on plain completions and an unknown named function are 400s."""
    client = server.client()
    weather = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 8}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }
    ask = [{"role": "user", "content": "Weather in Oslo?"}]
    chat = dict(model=MODEL, tools=[weather], tool_choice="required", max_tokens=160, temperature=0)
    choice = client.chat.completions.create(messages=ask, **chat).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and "city" in json.loads(call.function.arguments)
    chunks = list(client.chat.completions.create(messages=ask, stream=True, **chat))
    streamed = [t for c in chunks for t in (c.choices[0].delta.tool_calls or [])]
    assert [t.function.name for t in streamed if t.function.name] == ["get_weather"]
    assert {t.index for t in streamed} == {0} and streamed[0].id.startswith("call_")
    pieces = [t.function.arguments for t in streamed]
    assert pieces[0] == "" and len(pieces) > 2  # the header, then the arguments as written
    assert "".join(pieces) == call.function.arguments  # the non-streamed call's, exactly
    assert not "".join(c.choices[0].delta.content or "" for c in chunks)  # a call, no content
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    follow = [
        *ask,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "snow, -3 C"},
    ]
    reply = client.chat.completions.create(
        model=MODEL, messages=follow, tools=[weather], max_tokens=8
    )
    assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")
    with pytest.raises(openai.BadRequestError, match="chat completions"):
        client.completions.create(model=MODEL, prompt="x", extra_body={"tools": [weather]})
    named = {"type": "function", "function": {"name": "nope"}}
    with pytest.raises(openai.BadRequestError, match="tool_choice"):
        client.chat.completions.create(messages=ask, **{**chat, "tool_choice": named})
