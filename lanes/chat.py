"""Chat templates: the model's own jinja2 template, rendered in a sandbox as transformers does."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache

from jinja2 import TemplateError, meta
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    """The messages could not be rendered (bad roles, template raised, no template)."""


def _raise(message: str) -> None:
    raise ChatTemplateError(message)


@dataclass(frozen=True)
class Chat:
    """Messages with the tools a template that has its own tool section renders (HF's
    `apply_chat_template(messages, tools=...)`): a prompt the engine encodes like a plain
    message list."""

    messages: list[dict]
    tools: list[dict] | None = None  # [{"type": "function", "function": {...}}, ...]
    # more names the template reads (vLLM's chat_template_kwargs, e.g. Qwen3's enable_thinking)
    template_kwargs: dict | None = None


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.filters["tojson"] = _tojson
    return env


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    """transformers' `tojson` filter for chat templates: json.dumps with its keyword arguments
    (non-ASCII kept by default)."""
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


@lru_cache(maxsize=8)
def _compile(source: str):
    return _environment().from_string(source)


def check_template(source: str) -> None:
    """A ChatTemplateError where a template does not compile, or fails on a plain chat."""
    try:
        _compile(source)
    except TemplateError as e:
        raise ChatTemplateError(f"the chat template does not compile: {e}") from e
    render_chat(source, [{"role": "user", "content": "hi"}])


@lru_cache(maxsize=8)
def takes_tools(template: str | None) -> bool:
    """Whether the template renders a `tools` list itself (Qwen's, Llama 3.1's, Hermes'...)."""
    if not template:
        return False
    try:
        return "tools" in meta.find_undeclared_variables(_environment().parse(template))
    except TemplateError:
        return False


def render_chat(
    template: str | None,
    messages: list[dict],
    *,
    bos_token: str = "",
    eos_token: str = "",
    add_generation_prompt: bool = True,
    tools: list[dict] | None = None,
    template_kwargs: dict | None = None,
) -> str:
    if not template:
        raise ChatTemplateError("this model has no chat template; send a plain prompt instead")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise ChatTemplateError(f"message {i} needs a 'role' and a 'content'")
    try:
        return _compile(template).render(
            messages=messages,
            bos_token=bos_token,
            eos_token=eos_token,
            add_generation_prompt=add_generation_prompt,
            tools=tools,
            **(template_kwargs or {}),
        )
    except TemplateError as e:
        raise ChatTemplateError(f"chat template failed: {e}") from e
