"""Tool calling (lanes/tools.py): tools and tool_choice checked, earlier calls and results
written back into the chat, <tool_call> blocks parsed into tool_calls, and required / named
calls held by a grammar to the function's parameters (negative control: the same model and
prompt with tool_choice auto writes no call)."""

from __future__ import annotations

import json

import pytest

from lanes import build_engine
from lanes.chat import Chat, render_chat, takes_tools
from lanes.openai_api import parse_request
from lanes.tools import ToolCallStream, ToolError, Tools, messages_with_tools, parse_tools

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 10}},
            "required": ["city"],
            "additionalProperties": False,  # as OpenAI's strict function schemas have it
        },
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_tools_and_tool_choice_are_checked():
    tools = parse_tools({"tools": [WEATHER]})
    assert tools.choice == "auto" and list(tools.functions) == ["get_weather"]
    named = {"type": "function", "function": {"name": "get_weather"}}
    assert parse_tools({"tools": [WEATHER], "tool_choice": named}).choice == "get_weather"
    assert parse_tools({"tools": [WEATHER], "tool_choice": "none"}).active is False
    assert parse_tools({}) is None
    for body, param in [
        ({"tools": [{"type": "function"}]}, "tools"),
        ({"tools": "get_weather"}, "tools"),
        ({"tools": [WEATHER], "tool_choice": "always"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
         "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
    ]:  # fmt: skip
        with pytest.raises(ToolError) as e:
            parse_tools(body)
        assert e.value.param == param


def test_earlier_calls_and_results_are_written_into_the_chat():
    call = {"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}  # fmt: skip
    chat = [
        {"role": "system", "content": "Be brief."},
        *ASK,
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny, 21 C"},
    ]
    out = messages_with_tools(chat, parse_tools({"tools": [WEATHER]}))
    assert out[0]["role"] == "system" and out[0]["content"].startswith("Be brief.")
    assert '"name": "get_weather"' in out[0]["content"] and "<tools>" in out[0]["content"]
    assert out[2] == {
        "role": "assistant",
        "content": '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>',
    }
    assert out[3] == {"role": "user", "content": "<tool_response>\nsunny, 21 C\n</tool_response>"}
    assert messages_with_tools(ASK, None) == ASK  # no tools: the chat as it was


def test_call_grammars_close_objects_that_list_their_properties():
    from lanes.tools import _closed

    schema = {
        "type": "object",
        "properties": {
            "properties": {"type": "object", "properties": {"a": {"type": "string"}}},
            "free": {"type": "object", "additionalProperties": True, "properties": {}},
            "list": {"type": "array", "items": {"properties": {"b": {}}}},
        },
    }
    out = _closed(schema)
    assert out["additionalProperties"] is False
    inner = out["properties"]["properties"]
    assert inner["additionalProperties"] is False and set(inner["properties"]) == {"a"}
    assert out["properties"]["free"]["additionalProperties"] is True  # said otherwise: kept
    assert out["properties"]["list"]["items"]["additionalProperties"] is False
    assert set(out["properties"]) == {"properties", "free", "list"}  # no key added to a map
    assert "additionalProperties" not in schema  # the request's own schema is not changed


def test_tool_call_blocks_are_parsed():
    tools = Tools({"get_weather": {}}, {"get_weather": ""}, "auto")
    text = ('Let me check. <tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}'
            '</tool_call><tool_call>{"name": "unknown", "arguments": {}}</tool_call>'
            "<tool_call>not json</tool_call>")  # fmt: skip
    content, calls = tools.parse(text)
    assert content.startswith("Let me check.") and len(calls) == 1
    assert calls[0]["function"] == {"name": "get_weather", "arguments": '{"city": "Oslo"}'}
    assert calls[0]["id"].startswith("call_") and calls[0]["type"] == "function"
    assert tools.parse("no calls here") == ("no calls here", [])
    two = '<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>' * 2
    assert len(tools.parse(two)[1]) == 2
    single = Tools({"get_weather": {}}, {"get_weather": ""}, "auto", parallel=False)
    assert len(single.parse(two)[1]) == 1  # parallel_tool_calls: false
    stream = ToolCallStream(single)
    deltas = [d for b in (two[: len(two) // 2], two[len(two) // 2 :]) for d in stream.feed(b)[1]]
    assert len(_joined(deltas)) == 1 and stream.num_calls == 1
    assert parse_tools({"tools": [WEATHER], "parallel_tool_calls": False}).parallel is False


def _joined(deltas: list[dict]) -> list[dict]:
    """tool_calls deltas joined by index, as a client does: id and name from the first, the
    arguments pieces concatenated."""
    calls: dict[int, dict] = {}
    for d in deltas:
        call = calls.setdefault(d["index"], {"arguments": ""})
        call.update({k: d[k] for k in ("id", "type") if k in d})
        fn = d.get("function", {})
        if "name" in fn:
            call["name"] = fn["name"]
        call["arguments"] += fn.get("arguments", "")
    return [calls[i] for i in sorted(calls)]


@pytest.mark.parametrize("piece", [1, 3, 1000])
def test_a_streamed_text_splits_into_content_and_calls(piece):
    """Fed in pieces of any size: the content comes out at once except a possible tag start; a
    call's header as soon as its name is written, then its arguments piece by piece, joining to
    the arguments the whole text parses to; a block that is no call stays content."""
    tools = Tools({"get_weather": {}}, {"get_weather": ""}, "auto")
    args = '{"city": "O\\"slo}", "days": [1, {"n": 2}]}'  # a quote and braces inside a string
    text = (f'Checking <tool_call>{{"name": "get_weather", "arguments": {args}}}'
            '</tool_call> and <tool_call>{"name": "nope"}</tool_call> done <tool')  # fmt: skip
    stream, content, deltas, pieces = ToolCallStream(tools), "", [], 0
    for k in range(0, len(text), piece):
        c, new = stream.feed(text[k : k + piece])
        content, deltas = content + c, deltas + new
        pieces += sum(1 for d in new if d.get("function", {}).get("arguments"))
        assert "<tool_call>" not in c or "nope" in c  # only a failed block passes as content
    content += stream.flush()
    assert content == 'Checking  and <tool_call>{"name": "nope"}</tool_call> done <tool'
    (call,) = _joined(deltas)
    assert call["name"] == "get_weather" and call["id"].startswith("call_")
    assert call["arguments"] == args == tools.parse(text)[1][0]["function"]["arguments"]
    # as written: each piece of arguments text fed went out at once (one, fed whole)
    assert pieces == 1 if piece == 1000 else pieces >= len(args) // piece
    assert stream.num_calls == 1


def test_a_streamed_call_cut_short_and_arguments_that_are_no_object():
    tools = Tools({"get_weather": {}}, {"get_weather": ""}, "auto")
    stream = ToolCallStream(tools)
    _, deltas = stream.feed('<tool_call>{"name": "get_weather", "arguments": {"city": "Os')
    assert _joined(deltas)[0]["arguments"] == '{"city": "Os'
    assert stream.flush() == ""  # max_tokens mid-call: the rest is not passed on as content
    stream = ToolCallStream(tools)  # arguments written as a JSON string: sent whole at the end
    c, deltas = stream.feed('<tool_call>{"name": "get_weather", "arguments": "{}"}</tool_call>')
    assert c == "" and _joined(deltas)[0]["arguments"] == "{}"


@pytest.mark.parametrize("choice", ["required", "named"])
def test_required_and_named_calls_follow_the_parameters(long_model_dir, choice):
    engine = build_engine(str(long_model_dir))
    tool_choice = (
        "required"
        if choice == "required"
        else {"type": "function", "function": WEATHER["function"]}
    )
    body = {"messages": ASK, "tools": [WEATHER], "tool_choice": tool_choice, "max_tokens": 160}
    parsed = parse_request(body, True, engine.context_len)
    (out,) = engine.generate(parsed.prompts, parsed.params[0])
    content, calls = parsed.tools.parse(out.text)
    assert out.finish_reason == "stop" and content is None and len(calls) == 1, out.text
    args = json.loads(calls[0]["function"]["arguments"])
    assert calls[0]["function"]["name"] == "get_weather"
    assert isinstance(args["city"], str) and len(args["city"]) <= 10
    # negative control: left free (auto), the same random model writes no call
    free = parse_request({**body, "tool_choice": "auto"}, True, engine.context_len)
    (out,) = engine.generate(free.prompts, free.params[0])
    assert free.tools.parse(out.text)[1] == []


# A template with its own tool section, laid out as Qwen2.5's (tools listed in the system turn,
# calls as <tool_call> JSON with the arguments as an object, results in a user turn).
OWN_TOOLS = """{%- if tools %}<|im_start|>system
# Tools
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>
Answer a call as <tool_call>{"name": ..., "arguments": ...}</tool_call><|im_end|>
{% endif %}{% for m in messages %}{% if m.role == 'tool' %}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% elif m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant
{% for c in m.tool_calls %}<tool_call>{{ {"name": c.function.name, "arguments": c.function.arguments}
| tojson }}</tool_call>{% endfor %}<|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""
PLAIN = """{% for m in messages %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


def test_a_template_with_its_own_tool_section_renders_the_tools():
    call = {"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}  # fmt: skip
    chat = [
        *ASK,
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny, 21 C"},
    ]
    body = {"messages": chat, "tools": [WEATHER]}
    assert takes_tools(OWN_TOOLS) and not takes_tools(PLAIN) and not takes_tools(None)
    native = parse_request(body, True, 4096, native_tools=True).prompts[0]
    assert isinstance(native, Chat) and native.tools == [WEATHER]
    text = render_chat(OWN_TOOLS, native.messages, tools=native.tools)
    assert "# Tools\n<tools>\n" + json.dumps(WEATHER) in text
    assert "You may call functions" not in text  # lanes' own description is not added
    # the earlier call's arguments reach the template as an object, not a JSON string
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>' in text
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in text
    # tool_choice none: no tools section
    off = parse_request({**body, "tool_choice": "none"}, True, 4096, native_tools=True)
    assert "# Tools" not in render_chat(OWN_TOOLS, off.prompts[0].messages, tools=None)
    # negative control: a template without one gets lanes' system prompt and tags instead
    plain = parse_request(body, True, 4096, native_tools=False).prompts[0]
    assert isinstance(plain, list) and "You may call functions" in plain[0]["content"]


def test_required_call_through_a_template_with_its_own_tool_section(long_model_dir):
    engine = build_engine(str(long_model_dir))
    engine.tokenizer.chat_template = OWN_TOOLS
    body = {"messages": ASK, "tools": [WEATHER], "tool_choice": "required", "max_tokens": 160}
    parsed = parse_request(body, True, engine.context_len, takes_tools(OWN_TOOLS))
    (prompt,) = parsed.prompts
    rendered = engine.tokenizer.decode(engine.encode(prompt), skip_special_tokens=False)
    assert "# Tools" in rendered and "get_weather" in rendered
    (out,) = engine.generate(parsed.prompts, parsed.params[0])
    content, calls = parsed.tools.parse(out.text)
    assert content is None and [c["function"]["name"] for c in calls] == ["get_weather"]
