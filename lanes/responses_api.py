"""OpenAI's Responses API (`POST /v1/responses`), stateless: a request becomes the chat
completions request it means (input items -> messages, flat function tools -> chat tools,
text.format -> response_format), runs as one, and its answer comes back as a Response object —
reasoning, message and function_call output items — or as the Responses stream's events.

Stateless: nothing is stored (`store` is ignored), so `previous_response_id` is refused with a
400; a client sends the whole conversation as `input`, as the openai-agents SDK does by default.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from lanes.async_engine import Aborted, Delta, Failed, Finished
from lanes.openai_api import ApiError
from lanes.reasoning import ReasoningStream
from lanes.responses import RequestContext

_ROLES = ("system", "developer", "user", "assistant")
# request fields that change nothing lanes does (no storage, metadata, our own truncation)
_IGNORED = ("store", "metadata", "user", "truncation", "include", "service_tier", "reasoning",
            "background", "prompt_cache_key", "safety_identifier", "stream_options")  # fmt: skip


def chat_body(body: dict) -> dict:
    """The chat completions body a Responses request means (ApiError where it cannot be)."""
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object")
    if body.get("previous_response_id") is not None:
        raise ApiError(
            "lanes keeps no responses (stateless): send the whole conversation as 'input'",
            "previous_response_id",
        )
    messages = []
    if body.get("instructions") is not None:
        if not isinstance(body["instructions"], str):
            raise ApiError("'instructions' must be a string", "instructions")
        messages.append({"role": "system", "content": body["instructions"]})
    messages += _messages(body.get("input"))
    out = {"messages": messages, "model": body.get("model")}
    for name in ("temperature", "top_p", "stream", "parallel_tool_calls", "seed", "draft",
                 "cache_salt", "top_logprobs"):  # fmt: skip
        if body.get(name) is not None:
            out[name] = body[name]
    if body.get("max_output_tokens") is not None:
        out["max_tokens"] = body["max_output_tokens"]
    if body.get("tools"):
        out["tools"] = [_chat_tool(t, i) for i, t in enumerate(_list(body["tools"], "tools"))]
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        choice = {"type": "function", "function": {"name": choice.get("name")}}
    if choice is not None:
        out["tool_choice"] = choice
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        spec = {"name": fmt.get("name", "output"), "schema": fmt.get("schema")}
        out["response_format"] = {"type": "json_schema", "json_schema": spec}
    elif isinstance(fmt, dict) and fmt.get("type") == "json_object":
        out["response_format"] = {"type": "json_object"}
    known = {"model", "input", "instructions", "max_output_tokens", "tools", "tool_choice",
             "text", "previous_response_id", *_IGNORED, *out}  # fmt: skip
    for name in body:
        if name not in known:
            out[name] = body[name]  # the chat parser judges it (vLLM fields, unknown names)
    return out


def _list(value, name: str) -> list:
    if not isinstance(value, list):
        raise ApiError(f"'{name}' must be a list", name)
    return value


def _chat_tool(tool, i: int) -> dict:
    if not isinstance(tool, dict) or tool.get("type") != "function" or not tool.get("name"):
        raise ApiError(f"tools[{i}] must be a function tool: {{type, name, parameters}}", "tools")
    fn = {k: tool[k] for k in ("name", "description", "parameters") if tool.get(k) is not None}
    return {"type": "function", "function": fn}


def _text(content, where: str) -> str:
    """An item's content: text, or a list of input_text / output_text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") in ("input_text", "output_text", "text")
        and isinstance(p.get("text"), str) for p in content
    ):  # fmt: skip
        return "".join(p["text"] for p in content)
    raise ApiError(f"{where}: content must be text or input_text parts", "input")


def _messages(value) -> list[dict]:
    """Input items -> chat messages: function calls join the assistant turn before them, their
    outputs become tool messages."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    out: list[dict] = []
    for i, item in enumerate(_list(value, "input")):
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message" and item.get("role") in _ROLES:
            out.append({"role": item["role"], "content": _text(item.get("content"), f"input[{i}]")})
        elif kind == "function_call":
            call = {"id": item.get("call_id") or item.get("id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments", "")}}  # fmt: skip
            if out and out[-1]["role"] == "assistant" and "tool_calls" in out[-1]:
                out[-1]["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else json.dumps(output)
            out.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": text})
        elif kind == "reasoning":
            continue  # the model's own earlier reasoning: not sent back to the template
        else:
            raise ApiError(f"input[{i}]: unsupported item {str(kind)[:40]!r}", "input")
    return out


class ResponsesRequest(RequestContext):
    """One /v1/responses request: the chat choice as a Response object or its event stream."""

    def __init__(self, body: dict, *args, **kw) -> None:
        super().__init__(True, *args, **kw)
        self.body = body
        self.id = "resp_" + secrets.token_hex(12)

    def _items(self, c) -> tuple[list[dict], str | None]:
        """The output items of the finished choice, and why it is incomplete (or None)."""
        message, reason = self._message(c)
        items = []
        if message.get("reasoning_content"):
            text = message["reasoning_content"]
            items.append({"type": "reasoning", "id": "rs_" + secrets.token_hex(12), "summary": [],
                          "content": [{"type": "reasoning_text", "text": text}]})  # fmt: skip
        if message.get("content") or not message.get("tool_calls"):
            items.append(_message_item(message.get("content") or ""))
        for call in message.get("tool_calls", []):
            items.append(_call_item(call))
        return items, "max_output_tokens" if reason == "length" else None

    def _response(self, status: str, output: list, incomplete: str | None, usage_: dict | None):
        b = self.body
        return {
            "id": self.id, "object": "response", "created_at": self.created, "status": status,
            "error": None, "incomplete_details": None if incomplete is None else {"reason": incomplete},
            "instructions": b.get("instructions"), "max_output_tokens": b.get("max_output_tokens"),
            "model": self.model, "output": output, "parallel_tool_calls": b.get("parallel_tool_calls", True),
            "previous_response_id": None, "reasoning": None, "store": False,
            "temperature": b.get("temperature", 1.0), "top_p": b.get("top_p", 1.0),
            "text": b.get("text") or {"format": {"type": "text"}},
            "tool_choice": b.get("tool_choice", "auto"), "tools": b.get("tools", []),
            "truncation": "disabled", "usage": usage_, "metadata": b.get("metadata") or {},
        }  # fmt: skip

    def _usage(self, completions: dict) -> dict:
        u = self._finish(completions)
        return {
            "input_tokens": u["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": u["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": u["total_tokens"],
        }

    async def whole(self, request: Request) -> Response:
        completions = await self.gather(request)
        if isinstance(completions, Response):
            return completions
        items, incomplete = self._items(completions[0])
        status = "incomplete" if incomplete else "completed"
        return JSONResponse(self._response(status, items, incomplete, self._usage(completions)))

    async def sse(self) -> AsyncIterator[str]:
        seq = iter(range(1 << 30))

        def event(kind: str, **fields) -> str:
            data = {"type": kind, "sequence_number": next(seq), **fields}
            return f"event: {kind}\ndata: {json.dumps(data)}\n\n"

        yield event("response.created", response=self._response("in_progress", [], None, None))
        yield event("response.in_progress", response=self._response("in_progress", [], None, None))
        msg_id, text = "msg_" + secrets.token_hex(12), ""
        thinking = (
            ReasoningStream(self.reasoning_inside) if self.reasoning_inside is not None else None
        )
        started = False
        async for _, ev in self._events():
            if isinstance(ev, Delta) and self.parsed.tools is None:
                piece = thinking.feed(ev.text)[1] if thinking else ev.text
                if piece and not started:  # the message item opens with its first text
                    started = True
                    yield event("response.output_item.added", output_index=0,
                                item=_message_item("", msg_id, "in_progress") | {"content": []})  # fmt: skip
                    yield event("response.content_part.added", item_id=msg_id, output_index=0,
                                content_index=0, part=_text_part(""))  # fmt: skip
                if piece:
                    text += piece
                    yield event("response.output_text.delta", item_id=msg_id, output_index=0,
                                content_index=0, delta=piece, logprobs=[])  # fmt: skip
            elif isinstance(ev, Failed | Aborted):
                body = self._failure(ev).body() if isinstance(ev, Failed) else None
                yield event("error", message=str(body or "aborted"))
                return
            elif isinstance(ev, Finished):
                completions = {0: ev.completion}
                items, incomplete = self._items(ev.completion)
                for index, item in enumerate(items):
                    if item["type"] == "message" and started:
                        item["id"] = msg_id
                        part = item["content"][0]
                        yield event("response.output_text.done", item_id=msg_id, output_index=index,
                                    content_index=0, text=part["text"], logprobs=[])  # fmt: skip
                        yield event("response.content_part.done", item_id=msg_id,
                                    output_index=index, content_index=0, part=part)  # fmt: skip
                    else:
                        yield event("response.output_item.added", output_index=index, item=item)
                        if item["type"] == "function_call":
                            yield event("response.function_call_arguments.delta", item_id=item["id"],
                                        output_index=index, delta=item["arguments"])  # fmt: skip
                            yield event("response.function_call_arguments.done", item_id=item["id"],
                                        output_index=index, arguments=item["arguments"])  # fmt: skip
                    yield event("response.output_item.done", output_index=index, item=item)
                status = "incomplete" if incomplete else "completed"
                final = self._response(status, items, incomplete, self._usage(completions))
                yield event(f"response.{status}", response=final)


def _text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message_item(text: str, item_id: str | None = None, status: str = "completed") -> dict:
    return {"type": "message", "id": item_id or "msg_" + secrets.token_hex(12), "status": status,
            "role": "assistant", "content": [_text_part(text)]}  # fmt: skip


def _call_item(call: dict) -> dict:
    return {"type": "function_call", "id": "fc_" + secrets.token_hex(12), "call_id": call["id"],
            "name": call["function"]["name"], "arguments": call["function"]["arguments"],
            "status": "completed"}  # fmt: skip
