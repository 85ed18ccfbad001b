"""vLLM's utility endpoints beside the OpenAI ones: /tokenize, /detokenize, /version and
/v1/models/{id} — request bodies in, response dicts out (the server wires them to routes).

    POST /tokenize    {"prompt": "Hi"} or {"messages": [...], "add_generation_prompt": true}
                      -> {"count": 2, "max_model_len": 2048, "tokens": [...]}
    POST /detokenize  {"tokens": [1, 2]} -> {"prompt": "..."}
"""

from __future__ import annotations

import time

from lanes import __version__
from lanes.openai_api import ApiError, parse_messages, refuse_control_tokens
from lanes.prompt_bounds import check_prompt_chars
from lanes.tokenizer import Tokenizer


def model_card(name: str, context_len: int) -> dict:
    return {
        "id": name,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "lanes",
        "max_model_len": context_len,
    }


def version() -> dict:
    return {"version": __version__}


def tokenize(body: dict, tokenizer: Tokenizer, context_len: int, control_tokens: list[str]) -> dict:
    """The token ids a completions (prompt) or chat (messages) request would run on."""

    def check_chars(prompt) -> None:  # a text no context holds is not tokenized
        try:
            check_prompt_chars(prompt, context_len, tokenizer.max_token_chars)
        except ValueError as e:
            raise ApiError(str(e), "messages" if isinstance(prompt, list) else "prompt") from e

    has_prompt, has_messages = "prompt" in body, "messages" in body
    if has_prompt == has_messages:
        raise ApiError("send exactly one of 'prompt' (a string) and 'messages' (a chat)")
    add_special = body.get("add_special_tokens", has_prompt)
    if not isinstance(add_special, bool):
        raise ApiError("'add_special_tokens' must be a boolean", "add_special_tokens")
    if has_prompt:
        prompt = body["prompt"]
        if not isinstance(prompt, str):
            raise ApiError("'prompt' must be a string", "prompt")
        check_chars(prompt)
        tokens = tokenizer.encode(prompt, add_special_tokens=add_special)
    else:
        messages = parse_messages(body["messages"])  # as chat completions takes them
        generation = body.get("add_generation_prompt", True)
        if not isinstance(generation, bool):
            raise ApiError("'add_generation_prompt' must be a boolean", "add_generation_prompt")
        check_chars(messages)
        refuse_control_tokens(messages, control_tokens)
        try:
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=generation)
        except ValueError as e:  # ChatTemplateError
            raise ApiError(str(e), "messages") from e
        tokens = tokenizer.encode(text, add_special_tokens=add_special)
    return {"count": len(tokens), "max_model_len": context_len, "tokens": tokens}


def detokenize(body: dict, tokenizer: Tokenizer) -> dict:
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in tokens
    ):
        raise ApiError("'tokens' must be a list of token ids", "tokens")
    bad = next((t for t in tokens if not 0 <= t < tokenizer.vocab_size), None)
    if bad is not None:
        raise ApiError(
            f"token id {bad} is outside the vocabulary (0..{tokenizer.vocab_size - 1})", "tokens"
        )
    return {"prompt": tokenizer.decode(tokens, skip_special_tokens=False)}
