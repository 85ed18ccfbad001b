"""OpenAI request fields -> lanes requests (the response objects' fields: lanes/response_fields.py)."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any

from lanes.chat import Chat
from lanes.grammar_limits import MAX_SCHEMA_DEPTH, GrammarTooLarge, check_schema
from lanes.grammar_spec import Grammar
from lanes.request_models import ChatCompletionRequest, CompletionRequest, unknown_fields
from lanes.sampling import SamplingParams
from lanes.tools import ToolError, Tools, messages_with_tools, parse_tools
from lanes.vllm_fields import FieldError, sampling_fields, template_kwargs

# Limits on one request, so no request can cost unbounded engine or host time (docs/serving.md).
MAX_N = 16
MAX_CHOICES = 64  # prompts x n: lanes one request may hold
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256
MAX_JSON_DEPTH = 32
MAX_SALT_CHARS = 1024
MAX_TEMPERATURE = 2.0
ROLES = ("system", "developer", "user", "assistant", "tool")


class ApiError(Exception):
    """An OpenAI-style error: HTTP status, message, and the offending parameter."""

    def __init__(
        self,
        message: str,
        param: str | None = None,
        status: int = 400,
        kind: str = "invalid_request_error",
    ):
        super().__init__(message)
        self.status, self.param, self.kind = status, param, kind

    def body(self) -> dict:
        return {
            "error": {"message": str(self), "type": self.kind, "param": self.param, "code": None}
        }


# Fields lanes does not implement: refuse them rather than silently ignore what changes output.
_UNSUPPORTED = {
    "functions": None,
    "best_of": None,
    "suffix": None,
}
_GRAMMAR_FIELDS = ("response_format", "structured_outputs", "guided_json", "guided_regex",
                   "guided_choice", "guided_grammar")  # fmt: skip
MAX_LOGIT_BIAS = 1024  # entries of one request's logit_bias


@dataclass(frozen=True)
class ParsedRequest:
    prompts: list[Any]  # each: text, token ids, or chat messages
    params: list[SamplingParams]  # one per choice of one prompt (n of them)
    stream: bool
    include_usage: bool
    cache_salt: str
    logprobs: int | None  # completions: top-N count; chat: top_logprobs (None: no logprobs)
    max_tokens_given: bool = True  # False: generate up to the context
    tools: Tools | None = None  # chat: the functions the model may call
    unknown_fields: tuple[str, ...] = ()  # field names lanes does not know (logged once each)
    echo: bool = False  # completions: the prompt (and its logprobs) before each choice's text
    prompt_logprobs: int | None = None  # vLLM's: each prompt token's logprob and N best
    generate: bool = True  # False: echo with max_tokens 0, the prompt alone
    return_token_ids: bool = False  # vLLM's: choices carry token_ids, prompt_token_ids beside
    return_draft_spans: bool = False  # lanes': choices carry draft_spans (lanes/draft_spans.py)


def decode_body(raw: bytes) -> dict:
    """The request body as a JSON object, or an ApiError saying what is wrong with it: not JSON,
    NaN/Infinity, numbers too long, nesting too deep, not an object, unpaired surrogates."""

    def refuse_constant(name: str) -> None:
        raise ValueError(f"{name} is not a JSON number")

    def finite_float(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):
            raise ValueError(f"the number {text[:20]} is out of range")
        return value

    try:
        body = json.loads(raw, parse_constant=refuse_constant, parse_float=finite_float)
    except RecursionError as e:
        raise ApiError(f"the request body nests deeper than {MAX_JSON_DEPTH} levels") from e
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        raise ApiError(f"the request body is not valid JSON: {str(e)[:200]}") from e
    if not isinstance(body, dict):
        raise ApiError(f"the request body must be a JSON object, not {_json_type(body)}")
    _check_values(body)
    return body


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    return names.get(type(value), "a number")


def _check_values(body: dict) -> None:
    """Every string is encodable text (no unpaired surrogates, which a client cutting a string
    mid-emoji sends), and nothing nests deeper than MAX_JSON_DEPTH. Paths are spelled out only
    for an error, so a long list of token ids costs one type check per item."""
    stack: list[tuple[Any, str, int]] = [(body, "", 0)]
    while stack:
        value, path, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise ApiError(f"the request body nests deeper than {MAX_JSON_DEPTH} levels")
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            if isinstance(key, str):
                _check_text(key, path or "the body", "a key in ")
            if isinstance(item, str):
                _check_text(item, _join(path, key))
            elif isinstance(item, dict | list):
                stack.append((item, _join(path, key), depth + 1))


def _join(path: str, key: str | int) -> str:
    return f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}".lstrip(".")


def _check_text(text: str, path: str, what: str = "") -> None:
    """The message names where the text is, never the text (it could not be encoded)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        top = path.split(".")[0].split("[")[0]
        raise ApiError(
            f"{what}'{path}' is not valid Unicode: an unpaired surrogate at character {e.start}",
            None if what else top,
        ) from e


def _get(body: dict, name: str, kind: type | tuple, default: Any = None) -> Any:
    value = body.get(name, default)
    if value is None:
        return default
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        try:
            value = float(value)
        except OverflowError as e:
            raise ApiError(f"'{name}' is out of range", name) from e
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise ApiError(f"'{name}' must be {names}", name)
    return value


def parse_request(
    body: Any,
    chat: bool,
    context_len: int,
    native_tools: bool = False,
    max_logprobs: int = 20,
    tool_format: str = "hermes",
) -> ParsedRequest:
    """native_tools: the chat template renders tools itself (lanes.chat.takes_tools);
    max_logprobs: the most logprobs / top_logprobs a request may ask for (--max-logprobs)."""
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object")
    for name, neutral in _UNSUPPORTED.items():
        if body.get(name) not in (None, neutral, [], {}):
            raise ApiError(f"'{name}' is not supported by lanes", name)
    if chat:
        messages = parse_messages(body.get("messages"))
        try:
            tools = parse_tools(body)
            if tools is not None:  # how this model family writes its calls
                tools = dataclasses.replace(tools, format=tool_format)
            chat_prompt = messages_with_tools(messages, tools, native_tools)
            extra = template_kwargs(body)
        except (ToolError, FieldError) as e:
            raise ApiError(str(e), e.param) from e
        if extra is not None:  # the template's extra names ride with the messages
            if isinstance(chat_prompt, Chat):
                chat_prompt = Chat(chat_prompt.messages, chat_prompt.tools, extra)
            else:
                chat_prompt = Chat(chat_prompt, None, extra)
        prompts: list[Any] = [chat_prompt]
    else:
        if body.get("tools") not in (None, []):
            raise ApiError("'tools' is for chat completions", "tools")
        tools = None
        prompts = _prompts(body.get("prompt"))
    n = _get(body, "n", int, 1)
    if not 1 <= n <= MAX_N:
        raise ApiError(f"'n' must be in [1, {MAX_N}]", "n")
    if len(prompts) * n > MAX_CHOICES:
        raise ApiError(
            f"{len(prompts)} prompts x n={n} is {len(prompts) * n} choices; "
            f"one request may ask for at most {MAX_CHOICES}",
            "prompt" if len(prompts) > 1 else "n",
        )
    stop = _stop_strings(body.get("stop"))
    if chat:
        max_tokens = _get(body, "max_completion_tokens", int)
        if max_tokens is None:
            max_tokens = _get(body, "max_tokens", int)
        logprobs = (
            _get(body, "top_logprobs", int, 0) if _get(body, "logprobs", bool, False) else None
        )
    else:  # vLLM takes max_completion_tokens here too
        max_tokens = _get(body, "max_completion_tokens", int)
        if max_tokens is None:
            max_tokens = _get(body, "max_tokens", int, 16)
        logprobs = _get(body, "logprobs", int)
    echo = False if chat else _get(body, "echo", bool, False)
    if chat and body.get("echo") not in (None, False):
        raise ApiError("'echo' is for completions", "echo")
    generate = not (echo and max_tokens == 0)  # echo alone: the prompt's logprobs, no tokens
    if max_tokens is not None and max_tokens < 1 and generate:
        raise ApiError(f"'max_tokens' must be at least 1, got {max_tokens}", "max_tokens")
    prompt_logprobs = _get(body, "prompt_logprobs", int)
    if prompt_logprobs is not None and not 0 <= prompt_logprobs <= max_logprobs:
        raise ApiError(f"'prompt_logprobs' must be in [0, {max_logprobs}]", "prompt_logprobs")
    if logprobs is not None and not 0 <= logprobs <= max_logprobs:
        raise ApiError(f"logprobs / top_logprobs must be in [0, {max_logprobs}]", "logprobs")
    temperature = _get(body, "temperature", float, 1.0)
    if not 0 <= temperature <= MAX_TEMPERATURE:
        raise ApiError(f"'temperature' must be in [0, {MAX_TEMPERATURE}]", "temperature")
    top_k = _get(body, "top_k", int, 0)
    if not -1 <= top_k < 2**31:
        raise ApiError("'top_k' must be -1 or 0 (whole vocabulary) or a positive count", "top_k")
    seed = _get(body, "seed", int)
    if seed is not None and not -(2**63) <= seed < 2**64:
        raise ApiError("'seed' must be a 64-bit integer", "seed")
    salt = _get(body, "cache_salt", str, "")
    if len(salt) > MAX_SALT_CHARS:
        raise ApiError(f"'cache_salt' is longer than {MAX_SALT_CHARS} characters", "cache_salt")
    options = _get(body, "stream_options", dict, {})
    try:
        extras = sampling_fields(body)
    except FieldError as e:
        raise ApiError(str(e), e.param) from e
    try:
        base = SamplingParams(
            # unset: up to the context (the engine stops there)
            max_tokens=(max_tokens or 1) if max_tokens is not None else context_len,
            temperature=temperature,
            top_p=_get(body, "top_p", float, 1.0),
            top_k=max(0, top_k),
            seed=None if seed is None else seed % 2**63,
            stop=stop,
            ignore_eos=_get(body, "ignore_eos", bool, False),
            draft=_get(body, "draft", bool, True),
            top_logprobs=logprobs or 0,
            presence_penalty=_get(body, "presence_penalty", float, 0.0),
            frequency_penalty=_get(body, "frequency_penalty", float, 0.0),
            repetition_penalty=_get(body, "repetition_penalty", float, 1.0),
            min_p=_get(body, "min_p", float, 0.0),
            min_tokens=_get(body, "min_tokens", int, 0),
            logit_bias=_logit_bias(body.get("logit_bias")),
            grammar=_grammar(body, tools),
            **extras,
        )
    except ValueError as e:
        raise ApiError(str(e)) from e
    # n choices: choice i samples with seed + i, so a seeded request reproduces every choice.
    params = [base if seed is None else _with_seed(base, seed + i) for i in range(n)]
    return ParsedRequest(
        prompts=prompts,
        params=params,
        stream=_get(body, "stream", bool, False),
        include_usage=bool(options.get("include_usage")),
        cache_salt=salt,
        logprobs=logprobs,
        max_tokens_given=max_tokens is not None,
        tools=tools if tools is not None and tools.active else None,
        unknown_fields=tuple(
            unknown_fields(body, ChatCompletionRequest if chat else CompletionRequest)
        ),
        echo=echo,
        prompt_logprobs=prompt_logprobs,
        generate=generate,
        return_token_ids=_get(body, "return_token_ids", bool, False),
        return_draft_spans=_get(body, "return_draft_spans", bool, False),
    )


def parse_messages(messages: Any) -> list[dict]:
    """A chat's messages checked (what chat completions and /tokenize take alike): a non-empty
    list of objects with a known role, text content, and tool_calls a list where given."""
    if not isinstance(messages, list) or not messages:
        raise ApiError("'messages' must be a non-empty list", "messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(f"messages[{i}] needs a string 'role'", "messages")
        if m["role"] not in ROLES:
            raise ApiError(
                f"messages[{i}].role must be one of {', '.join(ROLES)}; got {m['role'][:40]!r}",
                "messages",
            )
        m = dict(m)
        calls = m.get("tool_calls")
        if calls is not None and not isinstance(calls, list):
            raise ApiError(f"messages[{i}].tool_calls must be a list of tool calls", "messages")
        if m["role"] == "assistant" and calls and m.get("content") is None:
            m["content"] = ""  # a turn that only called tools
        m["content"] = _text_content(m.get("content"), i)
        out.append(m)
    return out


def _grammar(body: dict, tools: Tools | None) -> Grammar | None:
    """The structured output a request asks for: OpenAI's response_format (json_object,
    json_schema), vLLM's structured_outputs (json, regex, choice) or its older guided_* fields,
    or a required / named tool call; at most one of them."""
    given = [f for f in _GRAMMAR_FIELDS if body.get(f) not in (None, {"type": "text"}, {})]
    call = tools.grammar() if tools is not None else None
    if call is not None:
        given = ["tool_choice", *given]
    if len(given) > 1:
        raise ApiError(f"give one structured output, not {' and '.join(given)}", given[1])
    if not given:
        return None
    if call is not None:
        return call
    name, value = given[0], body[given[0]]
    if name == "response_format":
        return _response_format(value)
    if name == "structured_outputs":
        if not isinstance(value, dict):
            raise ApiError("'structured_outputs' must be an object", name)
        kinds = [k for k in ("json", "regex", "choice", "grammar") if value.get(k) is not None]
        if len(kinds) != 1:
            raise ApiError(
                "'structured_outputs' takes exactly one of json, regex, choice, grammar", name
            )
        name, value = f"structured_outputs.{kinds[0]}", value[kinds[0]]
    kind = name.split("_")[-1].split(".")[-1]
    if kind == "grammar":  # GBNF or Lark: a grammar that does not compile is the request's 400
        if not isinstance(value, str) or not value.strip():
            raise ApiError(f"'{name}' must be a non-empty GBNF or Lark grammar", name)
        return Grammar("grammar", value)
    if kind == "json":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except RecursionError as e:
                raise ApiError(f"'{name}' nests deeper than {MAX_SCHEMA_DEPTH} levels", name) from e
            except ValueError as e:
                raise ApiError(f"'{name}' is not a JSON schema: {str(e)[:100]}", name) from e
        if not isinstance(value, dict):
            raise ApiError(f"'{name}' must be a JSON schema object", name)
        try:
            check_schema(value)  # before anything walks it recursively
        except GrammarTooLarge as e:
            raise ApiError(str(e), name) from e
        return Grammar.json_schema(value)
    if kind == "regex":
        if not isinstance(value, str) or not value:
            raise ApiError(f"'{name}' must be a non-empty string", name)
        return Grammar("regex", value)
    if not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value):
        raise ApiError(f"'{name}' must be a non-empty list of strings", name)
    return Grammar.choice(value)


def _response_format(value: Any) -> Grammar | None:
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "json_object":
        return Grammar.json_schema({"type": "object"})
    if kind == "json_schema":
        spec = value.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise ApiError(
                "response_format json_schema needs 'json_schema': {'name': ..., 'schema': {...}}",
                "response_format",
            )
        return Grammar.json_schema(schema)
    raise ApiError(
        "'response_format' type must be text, json_object or json_schema", "response_format"
    )


def _logit_bias(raw: Any) -> tuple[tuple[int, float], ...]:
    """OpenAI's {"token id": bias} (ids as strings, or ints from vLLM clients)."""
    if raw is None:
        return ()
    if not isinstance(raw, dict) or len(raw) > MAX_LOGIT_BIAS:
        raise ApiError(
            f"'logit_bias' must map token ids to biases (at most {MAX_LOGIT_BIAS})", "logit_bias"
        )
    out = []
    for key, bias in raw.items():
        try:
            token = int(key)
        except (TypeError, ValueError) as e:
            raise ApiError(f"'logit_bias' key {key!r:.40} is not a token id", "logit_bias") from e
        if isinstance(bias, bool) or not isinstance(bias, int | float):
            raise ApiError(f"'logit_bias' value for {token} is not a number", "logit_bias")
        out.append((token, float(bias)))
    return tuple(sorted(out))


def _stop_strings(stop: Any) -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise ApiError("'stop' must be a non-empty string or a list of them", "stop")
    if len(stop) > MAX_STOP_STRINGS:
        raise ApiError(f"'stop' has {len(stop)} strings; at most {MAX_STOP_STRINGS}", "stop")
    if any(len(s) > MAX_STOP_CHARS for s in stop):
        raise ApiError(f"a stop string is longer than {MAX_STOP_CHARS} characters", "stop")
    return tuple(stop)


def check_context(prompt_len: int, max_tokens: int, context_len: int) -> None:
    """A request whose prompt and max_tokens do not fit the context is refused, not clipped."""
    if prompt_len + max_tokens > context_len:
        raise ApiError(
            f"this model's context is {context_len} tokens; the prompt has {prompt_len} and "
            f"max_tokens is {max_tokens} ({prompt_len + max_tokens} in all): lower max_tokens "
            "or shorten the prompt",
            "max_tokens",
        )


def refuse_control_tokens(messages: list[dict] | Chat, control_tokens: list[str]) -> None:
    """User text that spells a control token (e.g. "<|im_start|>system") would be tokenized into
    the real token and could fake a turn; refuse it (`--allow-special-tokens` lets it through).
    A template that renders tools itself renders their definitions and earlier calls too."""
    if isinstance(messages, Chat):
        texts = [(f"messages[{i}]", json.dumps(m)) for i, m in enumerate(messages.messages)]
        texts.append(("tools", json.dumps(messages.tools)))
        texts.append(("chat_template_kwargs", json.dumps(messages.template_kwargs)))
    else:
        texts = [(f"messages[{i}].content", m["content"]) for i, m in enumerate(messages)]
    for where, text in texts:
        for token in control_tokens:
            if token in text:
                raise ApiError(
                    f"{where} contains the control token {token!r}; the server "
                    "refuses it (started with --allow-special-tokens, it would pass)",
                    where if where in ("tools", "chat_template_kwargs") else "messages",
                )


def _with_seed(p: SamplingParams, seed: int) -> SamplingParams:
    import dataclasses

    return dataclasses.replace(p, seed=seed % 2**63)


def _text_content(content: Any, i: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise ApiError(f"messages[{i}]: only text content is supported", "messages")
            parts.append(str(part.get("text", "")))
        return "".join(parts)
    raise ApiError(f"messages[{i}] needs a string 'content'", "messages")


def _prompts(prompt: Any) -> list[Any]:
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt:
        if all(_is_id(t) for t in prompt):
            return [prompt]
        if all(isinstance(p, str) for p in prompt):
            return list(prompt)
        if all(isinstance(p, list) and p and all(_is_id(t) for t in p) for p in prompt):
            return list(prompt)
    raise ApiError("'prompt' must be a string, a list of strings, or token ids", "prompt")


def _is_id(t: Any) -> bool:
    return isinstance(t, int) and not isinstance(t, bool)
