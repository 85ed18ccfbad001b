"""Tool calls in the formats model families are trained to write, besides Hermes' `<tool_call>`
JSON blocks (lanes/tools.py), parsed into OpenAI's `tool_calls` (vLLM's --tool-call-parser names):

    llama3_json   {"name": "get_weather", "parameters": {"city": "Paris"}}   (Llama 3.x; the whole
                  answer, optionally after <|python_tag|>; several joined by ";")
    mistral       [TOOL_CALLS][{"name": ..., "arguments": {...}}]            (v0.3 tokenizers)
                  [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}             (v11+ tokenizers)
    qwen3_coder   <tool_call>\\n<function=get_weather>\\n<parameter=city>\\nParis\\n</parameter>\\n
                  </function>\\n</tool_call>                                 (Qwen3-Coder, Qwen3.5)
    glm45         <tool_call>get_weather\\n<arg_key>city</arg_key>\\n<arg_value>Paris</arg_value>\\n
                  </tool_call>                                               (GLM-4.5 / 4.6)

A format is chosen by --tool-call-parser or, by default, from the markers the chat template
writes. The XML formats write every value as text; a value is decoded as JSON where the
parameter's schema says it is not a string. Calls a grammar forces (tool_choice required or a
named function) are always Hermes blocks, which every format also parses.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable

FORMATS = ("hermes", "llama3_json", "mistral", "qwen3_coder", "glm45")
ALIASES = {"qwen3_xml": "qwen3_coder", "glm4_moe": "glm45", "llama4_json": "llama3_json",
           "llama3": "llama3_json"}  # fmt: skip

_QWEN_CALL = re.compile(r"<tool_call>\s*<function=([^>\n]+)>(.*?)</function>\s*</tool_call>", re.S)
_QWEN_PARAM = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.S)
_GLM_CALL = re.compile(r"<tool_call>\s*([^\s<]+)\s*(.*?)</tool_call>", re.S)
_GLM_PARAM = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)
_MISTRAL = "[TOOL_CALLS]"
_PYTHON_TAG = "<|python_tag|>"


def format_of(name: str | None, template: str | None) -> str:
    """The tool-call format: --tool-call-parser's name, else what the chat template writes."""
    if name is not None:
        return ALIASES.get(name, name) if ALIASES.get(name, name) in FORMATS else "hermes"
    t = template or ""
    if "<function=" in t and "<parameter=" in t:
        return "qwen3_coder"
    if "<arg_key>" in t and "<arg_value>" in t:
        return "glm45"
    if _MISTRAL in t:
        return "mistral"
    if _PYTHON_TAG in t or '"parameters": dictionary' in t:
        return "llama3_json"
    return "hermes"


def call(name: str, arguments: str) -> dict:
    return {"id": f"call_{secrets.token_hex(12)}", "type": "function",
            "function": {"name": name, "arguments": arguments}}  # fmt: skip


def _value(text: str, schema: dict | None) -> object:
    """An XML format's value: text for a string parameter, else JSON where it parses."""
    kind = (schema or {}).get("type")
    if kind == "string" or (kind is None and text.strip()[:1] not in ("{", "[")):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


def _xml_calls(pattern, param, text: str, functions: dict[str, dict]):
    calls, spans = [], []
    for m in pattern.finditer(text):
        name = m.group(1).strip()
        if name not in functions:
            continue
        props = functions[name].get("properties", {})
        args = {k.strip(): _value(v, props.get(k.strip())) for k, v in param.findall(m.group(2))}
        calls.append(call(name, json.dumps(args, ensure_ascii=False)))
        spans.append(m.span())
    return calls, spans


def _llama(text: str, functions: dict[str, dict]):
    body = text.strip()
    body = body.removeprefix(_PYTHON_TAG).strip()
    if not body.startswith("{"):
        return [], []
    decoder, calls, at = json.JSONDecoder(), [], 0
    while at < len(body):
        try:
            obj, end = decoder.raw_decode(body, at)
        except ValueError:
            return [], []  # not only calls: the answer is text
        args = obj.get("parameters", obj.get("arguments")) if isinstance(obj, dict) else None
        if (
            not isinstance(obj, dict)
            or obj.get("name") not in functions
            or not isinstance(args, dict)
        ):
            return [], []
        calls.append(call(obj["name"], json.dumps(args, ensure_ascii=False)))
        at = end
        while at < len(body) and body[at] in " \n\t;":
            at += 1
    return calls, [(0, len(text))]


def _mistral(text: str, functions: dict[str, dict]):
    start = text.find(_MISTRAL)
    if start < 0:
        return [], []
    rest, calls = text[start + len(_MISTRAL) :].strip(), []
    if rest.startswith("["):  # v0.3: a JSON list of calls
        try:
            listed = json.loads(rest)
        except ValueError:
            return [], []
        for obj in listed if isinstance(listed, list) else []:
            if isinstance(obj, dict) and obj.get("name") in functions:
                calls.append(call(obj["name"], json.dumps(obj.get("arguments", {}))))
    else:  # v11+: name[ARGS]{...}, each call after its own [TOOL_CALLS]
        for piece in (text[start:]).split(_MISTRAL)[1:]:
            name, sep, args = piece.partition("[ARGS]")
            if sep and name.strip() in functions:
                calls.append(call(name.strip(), args.strip()))
    return calls, [(start, len(text))] if calls else []


PARSERS: dict[str, Callable] = {
    "llama3_json": _llama,
    "mistral": _mistral,
    "qwen3_coder": lambda t, f: _xml_calls(_QWEN_CALL, _QWEN_PARAM, t, f),
    "glm45": lambda t, f: _xml_calls(_GLM_CALL, _GLM_PARAM, t, f),
}


def parse_native(fmt: str, text: str, functions: dict[str, dict]) -> tuple[str | None, list]:
    """(content, calls) of a format's calls in the text; content is the text outside them."""
    calls, spans = PARSERS[fmt](text, functions)
    if not calls:
        return text, []
    content, at = [], 0
    for a, b in spans:
        content.append(text[at:a])
        at = b
    content.append(text[at:])
    return "".join(content).strip() or None, calls


def starts_call(fmt: str, text: str) -> int:
    """Where a streamed answer's calls begin in `text` (-1: not yet): from there on a stream
    holds the text back and parses it at the end."""
    if fmt == "llama3_json":
        stripped = text.lstrip()
        return len(text) - len(stripped) if stripped[:1] in ("{", "<") else -1
    marker = _MISTRAL if fmt == "mistral" else "<tool_call>"
    return text.find(marker)


class NativeCallStream:
    """A streamed answer in one of these formats: content is passed on until the calls begin
    (or what could be their start), the rest is held and parsed when the choice ends; its calls
    then go out whole (a delta each with id, name and all the arguments)."""

    def __init__(self, fmt: str, functions: dict[str, dict], parallel: bool) -> None:
        self.fmt, self.functions, self.parallel = fmt, functions, parallel
        self.held, self.holding, self.num_calls = "", False, 0

    def feed(self, text: str) -> tuple[str, list[dict]]:
        self.held += text
        if self.holding:
            return "", []
        at = starts_call(self.fmt, self.held)
        if at >= 0:
            content, self.held, self.holding = self.held[:at], self.held[at:], True
            return content, []
        keep = _partial_marker(self.fmt, self.held)
        content, self.held = self.held[: len(self.held) - keep], self.held[len(self.held) - keep :]
        return content, []

    def finish(self) -> tuple[str, list[dict]]:
        """(content, calls) of what was held: the calls, or the text if it held none."""
        held, self.held = self.held, ""
        if not held:
            return "", []
        content, calls = parse_native(self.fmt, held, self.functions)
        calls = calls if self.parallel else calls[:1]
        self.num_calls = len(calls)
        deltas = [c | {"index": i} for i, c in enumerate(calls)]
        return content or "", deltas


def _partial_marker(fmt: str, text: str) -> int:
    """Length of the longest end of text that could begin the format's calls."""
    marker = _MISTRAL if fmt == "mistral" else "<tool_call>" if fmt != "llama3_json" else ""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
