"""vLLM's request fields beyond OpenAI's, and which fields a request may carry at all.

- stop_token_ids, include_stop_str_in_output, allowed_token_ids, bad_words,
  truncate_prompt_tokens: SamplingParams fields (the token-set ones are logits processing,
  lanes/penalties.py, so drafted output still equals undrafted under them);
- chat_template_kwargs: extra variables for the chat template (Qwen3's `enable_thinking`);
- which field names a request may carry at all: lanes/request_models.py.
"""

from __future__ import annotations

from typing import Any

MAX_TOKEN_LIST = 4096  # entries of allowed_token_ids or stop_token_ids
MAX_BAD_WORDS = 256
MAX_BAD_WORD_CHARS = 256

# Fields that would change the chat template's input, not extra variables for it.
_RESERVED = frozenset({"messages", "tools", "bos_token", "eos_token", "add_generation_prompt"})


class FieldError(ValueError):
    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def _token_ids(body: dict, name: str) -> tuple[int, ...]:
    value = body.get(name)
    if value is None:
        return ()
    if (
        not isinstance(value, list)
        or len(value) > MAX_TOKEN_LIST
        or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)
    ):
        raise FieldError(f"'{name}' must be a list of at most {MAX_TOKEN_LIST} token ids", name)
    return tuple(value)


def sampling_fields(body: dict) -> dict[str, Any]:
    """vLLM's sampling fields of the request, as SamplingParams keywords."""
    out: dict[str, Any] = {
        "stop_token_ids": _token_ids(body, "stop_token_ids"),
        "allowed_token_ids": _token_ids(body, "allowed_token_ids"),
    }
    if "allowed_token_ids" in body and body["allowed_token_ids"] == []:
        raise FieldError("'allowed_token_ids' must name at least one token", "allowed_token_ids")
    include = body.get("include_stop_str_in_output")
    if include is not None and not isinstance(include, bool):
        raise FieldError(
            "'include_stop_str_in_output' must be a boolean", "include_stop_str_in_output"
        )
    out["include_stop_str_in_output"] = bool(include)
    words = body.get("bad_words")
    if words is not None:
        if (
            not isinstance(words, list)
            or len(words) > MAX_BAD_WORDS
            or not all(isinstance(w, str) and w.strip() and len(w) <= MAX_BAD_WORD_CHARS
                       for w in words)
        ):  # fmt: skip
            raise FieldError(
                f"'bad_words' must be a list of at most {MAX_BAD_WORDS} non-empty strings of at "
                f"most {MAX_BAD_WORD_CHARS} characters",
                "bad_words",
            )
        out["bad_words"] = tuple(words)
    truncate = body.get("truncate_prompt_tokens")
    if truncate is not None and truncate != -1:  # vLLM's -1: the model's context, no cut here
        if not isinstance(truncate, int) or isinstance(truncate, bool) or truncate < 1:
            raise FieldError("'truncate_prompt_tokens' must be a positive count or -1",
                             "truncate_prompt_tokens")  # fmt: skip
        out["truncate_prompt_tokens"] = truncate
    return out


def template_kwargs(body: dict) -> dict[str, Any] | None:
    """chat_template_kwargs: names for the template to read besides the messages and tools; and
    `documents` (vLLM's and transformers' name for retrieval templates' sources: a list of
    objects of text fields), which the template reads as `documents`."""
    value = body.get("chat_template_kwargs")
    documents = body.get("documents")
    if documents is not None:
        if not isinstance(documents, list) or not all(
            isinstance(d, dict) and all(isinstance(v, str) for v in d.values()) for d in documents
        ):
            raise FieldError("'documents' must be a list of objects of text fields", "documents")
        if isinstance(value, dict) and "documents" in value:
            raise FieldError("'documents' is given twice", "documents")
        value = {**(value if isinstance(value, dict) else {}), "documents": documents}
    if value is None or value == {}:
        return None
    if not isinstance(value, dict):
        raise FieldError("'chat_template_kwargs' must be an object", "chat_template_kwargs")
    clash = sorted(set(value) & _RESERVED)
    if clash:
        raise FieldError(
            f"'chat_template_kwargs' cannot set {', '.join(clash)}: they come from the request",
            "chat_template_kwargs",
        )
    if not all(isinstance(k, str) and k.isidentifier() for k in value):
        raise FieldError("'chat_template_kwargs' keys must be names", "chat_template_kwargs")
    return dict(value)
