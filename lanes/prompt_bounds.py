"""A cheap bound checked before tokenizing: a prompt whose text is too long for the context,
whatever its tokens, is refused without tokenizing it (a 4 MB message was 680,001 tokens and
seconds of a shared thread before the context check said 400).

Every token stands for at most `max_token_chars` characters of text (its longest vocabulary
entry), so a text of C characters has at least C / max_token_chars tokens; the rendered chat
holds every message's text, so the same holds for a chat's contents. The bound keeps a factor of
two besides, for tokenizers whose normalizer drops characters.
"""

from __future__ import annotations

from typing import Any

from lanes.chat import Chat

SAFETY = 2


def prompt_chars(prompt: Any) -> int:
    """Characters of a prompt's text: a string's, or the sum of a chat's string contents
    (token ids: 0, they are counted as they are)."""
    if isinstance(prompt, str):
        return len(prompt)
    messages = prompt.messages if isinstance(prompt, Chat) else prompt
    if not isinstance(messages, list):
        return 0
    return sum(
        len(m["content"])
        for m in messages
        if isinstance(m, dict) and isinstance(m.get("content"), str)
    )


def max_prompt_chars(context_len: int, max_token_chars: int) -> int:
    """The most characters a prompt that fits the context can have."""
    return context_len * max(1, max_token_chars) * SAFETY


def check_prompt_chars(prompt: Any, context_len: int, max_token_chars: int) -> None:
    """A ValueError for a prompt too long to fit the context whatever its tokens."""
    chars, limit = prompt_chars(prompt), max_prompt_chars(context_len, max_token_chars)
    if chars > limit:
        raise ValueError(
            f"the prompt has {chars} characters; the model's context is {context_len} tokens, "
            f"which hold at most {limit} characters of it"
        )
