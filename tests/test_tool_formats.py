"""Tool calls in each family's own format (lanes/tool_formats.py): parsed whole and streamed in
any pieces to the same calls and content, typed by the parameters' schemas, chosen from the chat
template; Hermes blocks (what a forcing grammar writes) still parse under every format."""

from __future__ import annotations

import json
import random

import pytest

from lanes.tool_formats import NativeCallStream, format_of, parse_native
from lanes.tools import Tools

FUNCTIONS = {
    "get_weather": {"type": "object", "properties": {"city": {"type": "string"},
                                                      "days": {"type": "integer"}}},
    "convert": {"type": "object", "properties": {"amount": {"type": "number"},
                                                  "to": {"type": "string"}}},
}  # fmt: skip
WANT = [("get_weather", {"city": "Paris", "days": 3}), ("convert", {"amount": 2.5, "to": "EUR"})]

OUTPUTS = {
    "llama3_json": '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", '
    '"days": 3}}; {"name": "convert", "parameters": {"amount": 2.5, "to": "EUR"}}',
    "mistral": 'Checking. [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", '
    '"days": 3}}, {"name": "convert", "arguments": {"amount": 2.5, "to": "EUR"}}]',
    "qwen3_coder": "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
    "</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n"
    "<function=convert>\n<parameter=amount>\n2.5\n</parameter>\n<parameter=to>\nEUR\n</parameter>"
    "\n</function>\n</tool_call>",
    "glm45": "Checking.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris"
    "</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>\n<tool_call>"
    "convert\n<arg_key>amount</arg_key>\n<arg_value>2.5</arg_value>\n<arg_key>to</arg_key>\n"
    "<arg_value>EUR</arg_value>\n</tool_call>",
}
CONTENT = {"llama3_json": None, "mistral": "Checking.", "qwen3_coder": "Checking.",
           "glm45": "Checking."}  # fmt: skip


def _named(calls):
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


@pytest.mark.parametrize("fmt", sorted(OUTPUTS))
def test_each_format_parses_to_typed_calls(fmt):
    content, calls = parse_native(fmt, OUTPUTS[fmt], FUNCTIONS)
    assert _named(calls) == WANT and content == CONTENT[fmt]


def test_mistrals_newer_format():
    text = '[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo"}[TOOL_CALLS]convert[ARGS]{"to": "NOK"}'
    assert _named(parse_native("mistral", text, FUNCTIONS)[1]) == [
        ("get_weather", {"city": "Oslo"}), ("convert", {"to": "NOK"})
    ]  # fmt: skip


@pytest.mark.parametrize("fmt", sorted(OUTPUTS))
def test_streams_give_the_whole_parse_in_any_pieces(fmt):
    text, rng = OUTPUTS[fmt], random.Random(3)
    for _ in range(30):
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, 8)))
        stream, content = NativeCallStream(fmt, FUNCTIONS, parallel=True), ""
        for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True):
            piece, calls = stream.feed(text[a:b])
            content, _ = content + piece, calls
        rest, calls = stream.finish()
        assert _named(calls) == WANT and [c["index"] for c in calls] == [0, 1]
        assert (content + rest).strip() == (CONTENT[fmt] or "")


def test_text_that_is_no_call_stays_content():
    for fmt in OUTPUTS:
        assert parse_native(fmt, "Just an answer {not json", FUNCTIONS) == (
            "Just an answer {not json",
            [],
        )
        stream = NativeCallStream(fmt, FUNCTIONS, parallel=True)
        said = stream.feed("Just an answer")[0]
        assert said + stream.finish()[0] == "Just an answer"
    assert parse_native("llama3_json", '{"name": "unknown", "parameters": {}}', FUNCTIONS)[1] == []


def test_negative_control_hermes_does_not_read_another_format():
    tools = Tools(FUNCTIONS, dict.fromkeys(FUNCTIONS, ""), "auto")
    assert tools.parse(OUTPUTS["qwen3_coder"])[1] == []  # the hermes reader: no calls
    native = Tools(FUNCTIONS, dict.fromkeys(FUNCTIONS, ""), "auto", format="qwen3_coder")
    assert _named(native.parse(OUTPUTS["qwen3_coder"])[1]) == WANT


def test_a_forced_hermes_block_parses_under_every_format():
    block = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    for fmt in OUTPUTS:
        tools = Tools(FUNCTIONS, dict.fromkeys(FUNCTIONS, ""), "required", format=fmt)
        assert _named(tools.parse(block)[1]) == [("get_weather", {"city": "Oslo"})]


# Templates in each family's style (written for these tests: how each renders an earlier call)
TEMPLATES = {
    "qwen3_coder": "{{ '<tool_call>\\n<function=' + name + '>\\n<parameter=' + k + '>' }}",
    "glm45": "{{ '<tool_call>' + name }}<arg_key>{{ k }}</arg_key><arg_value>{{ v }}</arg_value>",
    "mistral": "{{ '[TOOL_CALLS]' + calls | tojson }}",
    "llama3_json": "{{ '<|python_tag|>' + call | tojson }}",
    "hermes": "{{ '<tool_call>' + call | tojson + '</tool_call>' }}",
}


@pytest.mark.parametrize("fmt", sorted(TEMPLATES))
def test_the_format_follows_the_template_unless_a_parser_is_named(fmt):
    assert format_of(None, TEMPLATES[fmt]) == fmt
    assert format_of("glm4_moe", TEMPLATES[fmt]) == "glm45"  # vLLM's name wins
    assert format_of("pythonic", TEMPLATES[fmt]) == "hermes"  # unknown: the notice says so


QWEN_STYLE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if tools %}{% for t in tools %}{{ t['function']['name'] }}\n{% endfor %}"
    "{# calls: <tool_call><function=name><parameter=k>v</parameter></function></tool_call> #}"
    "{% endif %}<|im_start|>assistant\n"
)
CALL = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"


def test_a_qwen_style_call_over_http_drafted_or_not(long_model_dir):
    """The answer forced to one Qwen3-Coder-style call (a regex), tool_choice auto: the server
    finds the format from the template and returns the call, streamed or not, drafted or not."""
    import re as regex

    from lanes import build_engine
    from lanes.drafter.ngram import NgramProposer
    from tests.live_server import LiveServer

    engine = build_engine(str(long_model_dir))
    engine.proposer = NgramProposer(min_n=1)  # drafts from the prompt's text
    engine.tokenizer.chat_template = QWEN_STYLE
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters":
              FUNCTIONS["get_weather"]}}]  # fmt: skip
    body = {"structured_outputs": {"regex": regex.escape(CALL)}}
    ask = dict(model="tiny", messages=[{"role": "user", "content": "Weather?"}], tools=tools,
               max_tokens=200, temperature=0)  # fmt: skip
    with LiveServer(engine) as live:
        c = live.client()
        outs = [c.chat.completions.create(**ask, extra_body={**body, "draft": d})
                for d in (True, False)]  # fmt: skip
        chunks = list(c.chat.completions.create(**ask, stream=True, extra_body=body))
    details = outs[0].usage.completion_tokens_details
    assert details.accepted_prediction_tokens + details.rejected_prediction_tokens > 0
    for out in outs:
        message = out.choices[0].message
        assert out.choices[0].finish_reason == "tool_calls" and message.content is None
        assert [
            (t.function.name, json.loads(t.function.arguments)) for t in message.tool_calls
        ] == [("get_weather", {"city": "Paris"})]
    streamed = [d.tool_calls for ch in chunks if ch.choices for d in [ch.choices[0].delta]
                if d.tool_calls]  # fmt: skip
    assert len(streamed) == 1 and streamed[0][0].function.name == "get_weather"
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
