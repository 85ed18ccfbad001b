"""OpenAI request fields -> lanes requests, and lanes results -> OpenAI response objects."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lanes.sampling import SamplingParams

MAX_N = 16


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
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "logit_bias": None,
    "tools": None,
    "functions": None,
    "best_of": None,
    "suffix": None,
    "echo": False,
}


@dataclass(frozen=True)
class ParsedRequest:
    prompts: list[Any]  # each: text, token ids, or chat messages
    params: list[SamplingParams]  # one per choice of one prompt (n of them)
    stream: bool
    include_usage: bool
    cache_salt: str
    logprobs: int | None  # completions: top-N count; chat: top_logprobs (None: no logprobs)


def _get(body: dict, name: str, kind: type | tuple, default: Any = None) -> Any:
    value = body.get(name, default)
    if value is None:
        return default
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise ApiError(f"'{name}' must be {names}", name)
    return value


def parse_request(body: Any, chat: bool, context_len: int) -> ParsedRequest:
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object")
    for name, neutral in _UNSUPPORTED.items():
        if body.get(name) not in (None, neutral, [], {}):
            raise ApiError(f"'{name}' is not supported by lanes", name)
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError("'messages' must be a non-empty list", "messages")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise ApiError(f"messages[{i}] needs a string 'role'", "messages")
            m["content"] = _text_content(m.get("content"), i)
        prompts: list[Any] = [messages]
    else:
        prompts = _prompts(body.get("prompt"))
    n = _get(body, "n", int, 1)
    if not 1 <= n <= MAX_N:
        raise ApiError(f"'n' must be in [1, {MAX_N}]", "n")
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and (
        not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop)
    ):
        raise ApiError("'stop' must be a non-empty string or a list of them", "stop")
    if chat:
        max_tokens = _get(body, "max_completion_tokens", int) or _get(body, "max_tokens", int)
        logprobs = (
            _get(body, "top_logprobs", int, 0) if _get(body, "logprobs", bool, False) else None
        )
    else:
        max_tokens = _get(body, "max_tokens", int, 16)
        logprobs = _get(body, "logprobs", int)
    if logprobs is not None and not 0 <= logprobs <= 20:
        raise ApiError("logprobs / top_logprobs must be in [0, 20]", "logprobs")
    seed = _get(body, "seed", int)
    options = _get(body, "stream_options", dict, {})
    try:
        base = SamplingParams(
            max_tokens=max_tokens if max_tokens is not None else context_len,
            temperature=_get(body, "temperature", float, 1.0),
            top_p=_get(body, "top_p", float, 1.0),
            top_k=max(0, _get(body, "top_k", int, 0)),
            seed=seed,
            stop=tuple(stop or ()),
            ignore_eos=_get(body, "ignore_eos", bool, False),
            draft=_get(body, "draft", bool, True),
            top_logprobs=logprobs or 0,
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
        cache_salt=_get(body, "cache_salt", str, ""),
        logprobs=logprobs,
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
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return [prompt]
        if all(isinstance(p, str) for p in prompt):
            return list(prompt)
        if all(isinstance(p, list) and p and all(isinstance(t, int) for t in p) for p in prompt):
            return list(prompt)
    raise ApiError("'prompt' must be a string, a list of strings, or token ids", "prompt")


def usage(prompt_tokens: int, completions: list, cached: int) -> dict:
    generated = sum(len(c.token_ids) for c in completions)
    accepted = sum(c.num_accepted for c in completions)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": generated,
        "total_tokens": prompt_tokens + generated,
        "prompt_tokens_details": {"cached_tokens": cached},
        "completion_tokens_details": {
            "accepted_prediction_tokens": accepted,
            "rejected_prediction_tokens": sum(c.num_drafted for c in completions) - accepted,
        },
    }


def chat_logprobs(tokenizer, token_ids: list[int], logprobs: list[float], top: list) -> dict:
    def entry(tid: int, lp: float) -> dict:
        text = tokenizer.decode([tid], skip_special_tokens=False)
        return {"token": text, "logprob": lp, "bytes": list(text.encode())}

    content = []
    for i, (tid, lp) in enumerate(zip(token_ids, logprobs, strict=True)):
        item = entry(tid, lp)
        item["top_logprobs"] = [entry(t, v) for t, v in top[i]] if i < len(top) else []
        content.append(item)
    return {"content": content}


def completion_logprobs(tokenizer, token_ids: list[int], logprobs: list[float], top: list) -> dict:
    tokens = [tokenizer.decode([t], skip_special_tokens=False) for t in token_ids]
    offsets, pos = [], 0
    for t in tokens:
        offsets.append(pos)
        pos += len(t)
    return {
        "tokens": tokens,
        "token_logprobs": logprobs,
        "top_logprobs": [
            {tokenizer.decode([t], skip_special_tokens=False): v for t, v in top[i]}
            if i < len(top)
            else {}
            for i in range(len(tokens))
        ],
        "text_offset": offsets,
    }
