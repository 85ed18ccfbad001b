"""Tool calling, Hermes style (Qwen, SmolLM2 and most open chat models are trained on it): the
model answers a call as

    <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>

and the server parses such blocks out of the text into OpenAI's `tool_calls`. A chat template
with its own tool section (Qwen's and Hermes' have one) renders the tools, earlier calls and
tool results itself, as the model was trained to see them; for any other template (SmolLM2's)
lanes describes the tools in a system message. With
tool_choice "required" or a named function, a grammar (lanes/grammar.py) holds the output to one
such block whose JSON matches the function's parameters; "auto" leaves the model free, "none"
describes no tools. Earlier turns' calls and tool results are written back into the messages as
the same tags, so any chat template renders them.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import Any

from lanes.chat import Chat
from lanes.grammar_limits import GrammarTooLarge, check_schema
from lanes.grammar_spec import Grammar
from lanes.tool_formats import NativeCallStream, parse_native

_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


class ToolError(ValueError):
    """A request's tools, tool_choice or tool messages are malformed (a 400 naming the field)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Tools:
    """A request's functions (name -> JSON schema of the arguments) and how it may call them."""

    functions: dict[str, dict]
    descriptions: dict[str, str]
    choice: str  # "auto" | "required" | "none" | a function's name
    parallel: bool = True  # False: at most one call per answer (parallel_tool_calls)
    format: str = "hermes"  # what the model writes under "auto" (lanes/tool_formats.py)

    @property
    def active(self) -> bool:
        return self.choice != "none"

    def listed(self) -> list[dict]:
        """The functions as OpenAI lists them (what templates with a tool section render)."""
        return [
            {"type": "function", "function": {"name": n, "description": self.descriptions[n],
                                              "parameters": p}}
            for n, p in self.functions.items()
        ]  # fmt: skip

    def system_prompt(self) -> str:
        return (
            "You may call functions to help with the user's request. The functions:\n<tools>\n"
            + "\n".join(json.dumps(t) for t in self.listed())
            + "\n</tools>\nTo call one, answer with a JSON object inside tags:\n"
            '<tool_call>{"name": <function name>, "arguments": <arguments object>}</tool_call>'
        )

    def grammar(self) -> Grammar | None:
        """What a required or named call must look like; None for auto and none."""
        if self.choice in ("auto", "none"):
            return None
        names = list(self.functions) if self.choice == "required" else [self.choice]
        calls = [
            {
                "type": "object",
                "properties": {"name": {"const": n}, "arguments": _closed(self.functions[n])},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for n in names
        ]
        schema = {"anyOf": calls, "x-guidance": {"whitespace_flexible": False}}
        return Grammar(
            "lark", f'start: "<tool_call>" call "</tool_call>"\ncall: %json {json.dumps(schema)}'
        )

    def stream(self):
        """The stream that splits this request's answers as they come: the model family's own
        format under "auto", Hermes blocks where a grammar forces the call."""
        if self.format == "hermes" or self.choice != "auto":
            return ToolCallStream(self)
        return NativeCallStream(self.format, self.functions, self.parallel)

    def parse(self, text: str) -> tuple[str | None, list[dict]]:
        """(content, tool_calls): calls in the model family's format, else every well-formed
        Hermes block naming a known function; the text around them is the content (None when
        empty)."""
        if self.format != "hermes":
            content, calls = parse_native(self.format, text, self.functions)
            if calls:
                return content, calls if self.parallel else calls[:1]
        calls: list[dict] = []
        for block in _CALL.findall(text):
            if calls and not self.parallel:
                break
            try:
                call = json.loads(block)
            except ValueError:
                continue
            if not isinstance(call, dict) or call.get("name") not in self.functions:
                continue
            args = call.get("arguments", {})
            raw = _raw_arguments(block)  # as written, so a streamed call joins to the same text
            if raw is not None:
                args = raw
            calls.append(
                {
                    "id": f"call_{secrets.token_hex(12)}",
                    "type": "function",
                    "function": {
                        "name": call["name"],
                        "arguments": args if isinstance(args, str) else json.dumps(args),
                    },
                }
            )
        if not calls:
            return text, []
        content = _CALL.sub("", text).strip()
        return content or None, calls


_OPEN, _CLOSE = "<tool_call>", "</tool_call>"


# a block's start up to its arguments' first character: {"name": "...", "arguments": <here>
_HEADER = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*(?=\S)')


@dataclass
class _OpenBlock:
    """A <tool_call> block still being written: the call it became (once its name is known)
    and how much of its arguments object has been sent."""

    index: int | None = None  # the call's index in the answer, once its header went out
    args_at: int = 0  # where the arguments value starts in the block's body
    sent: int = 0  # characters of the arguments value sent
    depth: int = 0  # JSON nesting inside the arguments value
    in_string: bool = False
    escaped: bool = False
    done: bool = False  # the arguments value is complete
    whole: bool = False  # not an object: its arguments go out whole when the block closes

    def scan(self, value: str) -> int:
        """Follow the arguments object from `sent` on; where the part written so far ends."""
        end = self.sent
        for c in value[self.sent :]:
            end += 1
            if self.escaped:
                self.escaped = False
            elif self.in_string:
                self.escaped, self.in_string = c == "\\", c != '"'
            elif c == '"':
                self.in_string = True
            elif c in "{[":
                self.depth += 1
            elif c in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.done = True
                    break
        return end


def _raw_arguments(block: str) -> str | None:
    """The arguments object of a complete <tool_call> block as the model wrote it (what the
    stream sent piece by piece), or None where the block is not laid out name first."""
    match = _HEADER.match(block[len(_OPEN) :] if block.startswith(_OPEN) else block)
    if match is None:
        return None
    value = match.string[match.end() :]
    if not value.startswith("{"):
        return None
    state = _OpenBlock()
    end = state.scan(value)
    return value[:end] if state.done else None


class ToolCallStream:
    """A streamed choice's text split as it arrives, as OpenAI streams tool calls: content is
    passed on at once, except what could be the start of a <tool_call> tag; a block whose name
    is a known function becomes a call as soon as its name is written — a first delta with the
    call's index, id, name and empty arguments, then its arguments object piece by piece as the
    model writes it (the pieces join to the call's arguments). A block that names no known
    function is passed on as content when it closes; with parallel_tool_calls false, blocks
    after the first call are dropped."""

    def __init__(self, tools: Tools) -> None:
        self.tools = tools
        self.held = ""  # text not yet passed on: a partial tag, or the open block
        self.block: _OpenBlock | None = None
        self.num_calls = 0

    def feed(self, text: str) -> tuple[str, list[dict]]:
        """(content to send now, tool_calls deltas to send now)."""
        self.held += text
        content, deltas = [], []
        while True:
            if self.block is None:
                start = self.held.find(_OPEN)
                if start < 0:
                    keep = _partial_tag(self.held)
                    content.append(self.held[: len(self.held) - keep])
                    self.held = self.held[len(self.held) - keep :]
                    break
                content.append(self.held[:start])
                self.held = self.held[start:]
                self.block = _OpenBlock()
            end = self.held.find(_CLOSE)
            body = self.held[len(_OPEN) : end if end >= 0 else len(self.held)]
            deltas += self._stream(body)
            if end < 0:  # the block is still being written
                break
            end += len(_CLOSE)
            closed, self.held = self.held[:end], self.held[end:]
            text_back, more = self._close(closed)
            content.append(text_back)
            deltas += more
            self.block = None
        return "".join(content), deltas

    def _stream(self, body: str) -> list[dict]:
        """The header once the name is known, then whatever is new of the arguments object."""
        b, out = self.block, []
        if b.index is None:
            match = _HEADER.match(body)
            if match is None or (self.num_calls and not self.tools.parallel):
                return []
            try:  # a name with an invalid escape is no call: the block stays content
                name = json.loads(match.group(1))
            except ValueError:
                return []
            if name not in self.tools.functions:
                return []
            b.index, b.args_at = self.num_calls, match.end()
            self.num_calls += 1
            out.append({"index": b.index, "id": f"call_{secrets.token_hex(12)}",
                        "type": "function", "function": {"name": name, "arguments": ""}})  # fmt: skip
        value = body[b.args_at :]
        if b.sent == 0 and value and not value.startswith("{"):
            b.whole = True
        if b.whole or b.done:
            return out
        end = b.scan(value)
        if end > b.sent:
            out.append({"index": b.index, "function": {"arguments": value[b.sent : end]}})
            b.sent = end
        return out

    def _close(self, block: str) -> tuple[str, list[dict]]:
        """(content, deltas) when a block closes: a call streamed so far is finished (its
        arguments whole, if they were not an object); another block naming a known function
        goes out whole; one naming none is content."""
        b = self.block
        found = self.tools.parse(block)[1]
        if b.index is not None:
            if b.whole and b.sent == 0 and found:
                args = found[0]["function"]["arguments"]
                return "", [{"index": b.index, "function": {"arguments": args}}]
            return "", []
        if not found:
            return block, []
        if self.num_calls and not self.tools.parallel:
            return "", []  # one call only: a later block is dropped, not shown as content
        call = found[0]
        self.num_calls += 1
        return "", [{"index": self.num_calls - 1, **call}]

    def flush(self) -> str:
        """What is left at the end (an unfinished block, a partial tag): content, unless it
        is the rest of a call already being sent."""
        rest, self.held = self.held, ""
        if self.block is not None and self.block.index is not None:
            rest = ""
        self.block = None
        return rest

    def finish(self) -> tuple[str, list[dict]]:
        """(content, calls) still to send at the end: calls went out as they were written."""
        return self.flush(), []


def _partial_tag(text: str) -> int:
    """Length of the longest end of text that begins the <tool_call> tag."""
    for n in range(min(len(text), len(_OPEN) - 1), 0, -1):
        if _OPEN.startswith(text[-n:]):
            return n
    return 0


def _closed(schema: Any) -> Any:
    """The schema with objects that list their properties closed to others unless it says
    otherwise (additionalProperties false, as OpenAI's strict function calling has them): a
    call's arguments are the function's parameters, and a small model held to a schema that
    allows any extra key can write keys until max_tokens."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in ("properties", "$defs", "definitions"):  # name -> schema
        if isinstance(out.get(key), dict):
            out[key] = {name: _closed(sub) for name, sub in out[key].items()}
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):  # lists of schemas
        if isinstance(out.get(key), list):
            out[key] = [_closed(sub) for sub in out[key]]
    for key in ("items", "additionalProperties", "not"):  # one schema
        if isinstance(out.get(key), dict):
            out[key] = _closed(out[key])
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def parse_tools(body: dict) -> Tools | None:
    """The request's `tools` and `tool_choice`, checked; None when it names no tools."""
    raw, choice = body.get("tools"), body.get("tool_choice", "auto")
    if raw in (None, []):
        if choice not in (None, "auto", "none"):
            raise ToolError("'tool_choice' needs 'tools'", "tool_choice")
        return None
    if not isinstance(raw, list):
        raise ToolError("'tools' must be a list of functions", "tools")
    functions, descriptions = {}, {}
    for i, tool in enumerate(raw):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if (
            not isinstance(tool, dict)
            or tool.get("type", "function") != "function"
            or not (isinstance(fn, dict) and isinstance(fn.get("name"), str) and fn["name"])
        ):
            raise ToolError(
                f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ...}}}}", "tools"
            )
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        if not isinstance(params, dict):
            raise ToolError(f"tools[{i}].function.parameters must be a JSON schema", "tools")
        try:  # the bounds its call's grammar must keep, checked before it is rendered
            check_schema(params)
        except GrammarTooLarge as e:
            raise ToolError(f"tools[{i}].function.parameters: {e}", "tools") from e
        if fn["name"] in functions:  # which one a call meant could not be told
            raise ToolError(f"tools[{i}] repeats the function name {fn['name'][:60]!r}", "tools")
        functions[fn["name"]] = params
        descriptions[fn["name"]] = str(fn.get("description", ""))
    if choice is None:
        choice = "auto"
    if isinstance(choice, dict):
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if choice.get("type") != "function" or name not in functions:
            raise ToolError("'tool_choice' names a function that is not in 'tools'", "tool_choice")
        choice = name
    elif choice not in ("auto", "required", "none"):
        raise ToolError("'tool_choice' must be auto, required, none or a function", "tool_choice")
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise ToolError("'parallel_tool_calls' must be a boolean", "parallel_tool_calls")
    return Tools(functions, descriptions, choice, parallel)


def messages_with_tools(
    messages: list[dict], tools: Tools | None, native: bool = False
) -> list[dict] | Chat:
    """The chat as the template renders it. `native` (a template with its own tool section):
    the messages as they are, earlier calls' arguments as objects (what HF templates expect), and
    the tools for the template. Otherwise: the tools' system prompt (merged into a leading
    system message), earlier calls as <tool_call> blocks in the assistant's text, tool results
    as <tool_response> blocks in a user turn."""
    if native:
        listed = tools.listed() if tools is not None and tools.active else None
        return Chat([_native_message(m) for m in messages], listed)
    out = []
    for m in messages:
        m = dict(m)
        if m["role"] == "assistant" and m.get("tool_calls"):
            blocks = [_call_text(c) for c in m.pop("tool_calls")]
            m["content"] = "\n".join(([m["content"]] if m.get("content") else []) + blocks)
        elif m["role"] == "tool":
            m = {"role": "user", "content": f"<tool_response>\n{m['content']}\n</tool_response>"}
        out.append(m)
    if tools is not None and tools.active:
        prompt = tools.system_prompt()
        if out and out[0]["role"] in ("system", "developer"):
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + prompt}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out


def _native_message(m: dict) -> dict:
    if m["role"] != "assistant" or not m.get("tool_calls"):
        return m
    calls = []
    for call in m["tool_calls"]:
        name, args = _call_parts(call)
        calls.append({"id": call.get("id"), "type": "function",
                      "function": {"name": name, "arguments": args}})  # fmt: skip
    return {**m, "tool_calls": calls}


def _call_parts(call: Any) -> tuple[str, Any]:
    """(name, arguments as an object) of an assistant message's tool call."""
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise ToolError("an assistant message's tool_calls need function names", "messages")
    args = fn.get("arguments", "{}")
    try:
        return fn["name"], json.loads(args) if isinstance(args, str) else args
    except ValueError as e:
        raise ToolError("a tool call's arguments must be JSON", "messages") from e


def _call_text(call: Any) -> str:
    name, args = _call_parts(call)
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"
