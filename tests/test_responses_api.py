"""OpenAI's Responses API (lanes/responses_api.py), through the official client: text, streamed
events, function tools, structured output; the same tokens as the chat request it means, drafted
or not; stateless (previous_response_id is a 400)."""

from __future__ import annotations

import json

import openai
import pytest

from lanes import build_engine
from lanes.responses_api import chat_body
from tests.live_server import LiveServer
from tests.replay_drafts import drafted_and_plain

TOOLS = [{"type": "function", "name": "get_weather", "description": "The weather in a city",
          "parameters": {"type": "object", "required": ["city"],
                         "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}}}}]  # fmt: skip


@pytest.fixture(scope="module")
def live(long_model_dir):
    with LiveServer(build_engine(str(long_model_dir))) as server:
        yield server


def test_text_is_the_chat_answer(live):
    c = live.client()
    r = c.responses.create(model="tiny", input="Say hi.", instructions="Be brief.",
                           max_output_tokens=8, temperature=0)  # fmt: skip
    chat = c.chat.completions.create(
        model="tiny", max_tokens=8, temperature=0,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi."}],
    )  # fmt: skip
    assert r.object == "response" and r.output[0].type == "message"
    assert r.output_text == chat.choices[0].message.content
    assert (r.usage.input_tokens, r.usage.output_tokens) == (chat.usage.prompt_tokens, 8)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"


def test_streamed_events_add_up_to_the_response(live):
    c = live.client()
    whole = c.responses.create(model="tiny", input="Count.", max_output_tokens=10, temperature=0)
    events = list(c.responses.create(model="tiny", input="Count.", max_output_tokens=10,
                                     temperature=0, stream=True))  # fmt: skip
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.incomplete" and "response.output_item.done" in kinds
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text == events[-1].response.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_a_required_tool_is_a_function_call_item(live):
    r = live.client().responses.create(model="tiny", input="Weather in Paris?", tools=TOOLS,
                                       tool_choice="required", max_output_tokens=160,
                                       temperature=0)  # fmt: skip
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls and calls[0].name == "get_weather"
    assert json.loads(calls[0].arguments)["city"] in ("Paris", "Oslo")
    assert calls[0].call_id.startswith("call_")


def test_structured_output_follows_the_schema(live):
    schema = {"type": "object", "required": ["ok"], "properties": {"ok": {"type": "boolean"}},
              "additionalProperties": False}  # fmt: skip
    r = live.client().responses.create(
        model="tiny", input="Answer.", max_output_tokens=20, temperature=0,
        text={"format": {"type": "json_schema", "name": "answer", "schema": schema}},
    )  # fmt: skip
    assert isinstance(json.loads(r.output_text)["ok"], bool)


def test_stateless_previous_response_id_is_refused(live):
    with pytest.raises(openai.BadRequestError, match="stateless"):
        live.client().responses.create(model="tiny", input="x", previous_response_id="resp_1")


def test_input_items_become_the_chat_they_mean():
    body = chat_body({
        "model": "m", "instructions": "sys", "max_output_tokens": 5, "tools": TOOLS,
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather",
             "arguments": '{"city": "Oslo"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "rain"},
        ],
    })  # fmt: skip
    assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "tool"]
    assert body["messages"][2]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert body["messages"][3] == {"role": "tool", "tool_call_id": "call_1", "content": "rain"}
    assert body["tools"][0]["function"]["name"] == "get_weather" and body["max_tokens"] == 5


def test_drafted_equals_undrafted_through_responses(long_model_dir):
    from lanes import SamplingParams

    engine = build_engine(str(long_model_dir))
    prompt = [{"role": "user", "content": "Tell a story."}]
    drafted, plain = drafted_and_plain(engine, [prompt], SamplingParams(max_tokens=12))
    assert drafted[0].token_ids == plain[0].token_ids
    with LiveServer(engine) as server:
        c = server.client()
        outs = [c.responses.create(model="tiny", input="Tell a story.", max_output_tokens=12,
                                   temperature=0, extra_body={"draft": d}).output_text
                for d in (True, False)]  # fmt: skip
    assert outs[0] == outs[1] == plain[0].text
