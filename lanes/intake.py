"""Intake: a request becomes a lane (validated and tokenized), and cancellations wait here for
the next step boundary.

Contract:
- `make_lane` reads only what never changes while rounds run (tokenizer, shapes, the pool's
  size), so the server's intake threads call it beside the engine's thread. Anything the request
  did wrong raises RequestError and leaves nothing behind; a grammar is compiled here, so a bad
  schema is that request's error and never a round's.
- `cancel` only records the id; `cancelled` (engine thread, between forwards) names the queued
  or running lanes to end now and forgets every recorded id, known or not.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable

from lanes.cache.block_table import BlockTable
from lanes.chat import Chat
from lanes.config import EngineConfig, ModelConfig
from lanes.detokenize import IncrementalDetokenizer
from lanes.grammar import GrammarCompiler
from lanes.lane import Lane
from lanes.prompt_bounds import check_prompt_chars
from lanes.sampling import SamplingParams
from lanes.tokenizer import Tokenizer

# A prompt is text, token ids, chat messages ([{"role": ..., "content": ...}, ...]), or messages
# with tools for a template that renders them itself (lanes.chat.Chat).
Prompt = str | list[int] | list[dict] | Chat


class RequestError(ValueError):
    """A request lanes cannot serve (too long, empty, bad ids): the engine keeps running."""


class Intake:
    def __init__(
        self,
        config: EngineConfig,
        model_config: ModelConfig,
        tokenizer: Tokenizer,
        num_blocks: int,
        eos_token_ids: frozenset[int],
        clock: Callable[[], float],
    ) -> None:
        self.config = config
        self.model_config = model_config
        self.tokenizer = tokenizer
        self.num_blocks = num_blocks
        self.eos_token_ids = eos_token_ids
        self.clock = clock
        cap, own = config.max_model_len, model_config.max_position_embeddings
        # prompt + output tokens a request may reach: the model's context, or less
        self.context_len = own if cap is None else min(own, cap)
        self._ids = itertools.count()
        self._grammars: GrammarCompiler | None = None
        self._cancel_requested: set[int] = set()

    @property
    def grammars(self) -> GrammarCompiler:
        """Structured outputs' matchers for this tokenizer (built at first use)."""
        if self._grammars is None:
            self._grammars = GrammarCompiler(
                self.tokenizer.to_json(), self.model_config.vocab_size, self.eos_token_ids
            )
        return self._grammars

    def encode(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        if isinstance(prompt, Chat):
            return self.tokenizer.encode_chat(prompt.messages, prompt.tools, prompt.template_kwargs)
        if prompt and all(isinstance(m, dict) for m in prompt):
            return self.tokenizer.encode_chat(prompt)
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return list(prompt)
        raise RequestError("a prompt is a string, a list of token ids, or a list of messages")

    def make_lane(self, prompt: Prompt, params: SamplingParams, cache_salt: str = "") -> Lane:
        """Validate a request and make its lane, not yet queued."""
        try:
            cache_salt.encode()
        except UnicodeEncodeError as e:
            raise RequestError("cache_salt is not valid Unicode (an unpaired surrogate)") from e
        try:  # before tokenizing: a text too long for the context costs nothing to refuse
            check_prompt_chars(prompt, self.context_len, self.tokenizer.max_token_chars)
        except ValueError as e:
            raise RequestError(str(e)) from e
        ids = self.encode(prompt)
        if params.truncate_prompt_tokens is not None:  # vLLM's: the prompt's last N tokens
            ids = ids[-params.truncate_prompt_tokens :]
        if params.bad_words:
            params = dataclasses.replace(params, bad_words_ids=self.bad_words_ids(params.bad_words))
        self._check_ids(ids, params)
        table = BlockTable(self.config.block_size)
        if table.blocks_needed(len(ids) + 1) > self.num_blocks:
            raise RequestError(
                f"the prompt has {len(ids)} tokens; the KV cache holds "
                f"{self.num_blocks * self.config.block_size} (raise kv_cache_bytes)"
            )
        cursor = None
        if params.grammar is not None:
            try:
                cursor = self.grammars.cursor(params.grammar)
            except ValueError as e:
                raise RequestError(str(e)) from e
        return Lane(
            request_id=next(self._ids),
            prompt_ids=ids,
            params=params.with_seed(),
            block_table=table,
            detokenizer=IncrementalDetokenizer(self.tokenizer, ids),
            cache_salt=cache_salt,
            arrival_time=self.clock(),
            grammar_cursor=cursor,
        )

    def _check_ids(self, ids: list[int], params: SamplingParams) -> None:
        vocab = self.model_config.vocab_size
        if not ids:
            raise RequestError("the prompt is empty")
        if any(not 0 <= t < vocab for t in ids):
            raise RequestError(f"prompt token ids must be in [0, {vocab})")
        if any(not 0 <= t < vocab for t, _ in params.logit_bias):
            raise RequestError(f"logit_bias token ids must be in [0, {vocab})")
        if any(not 0 <= t < vocab for t in params.allowed_token_ids):
            raise RequestError(f"allowed_token_ids must be in [0, {vocab})")
        if len(ids) >= self.context_len:
            raise RequestError(
                f"the prompt has {len(ids)} tokens; the model's context is {self.context_len} "
                "tokens and at least one must be left to generate"
            )

    def bad_words_ids(self, words: tuple[str, ...]) -> tuple[tuple[int, ...], ...]:
        """Each bad word as the token sequences it can appear as: alone and after a space (as
        vLLM tokenizes them)."""
        out: dict[tuple[int, ...], None] = {}
        for word in words:
            for text in (word.lstrip(), " " + word.lstrip()):
                ids = tuple(self.tokenizer.encode(text, add_special_tokens=False))
                if ids:
                    out[ids] = None
        return tuple(out)

    def cancel(self, request_id: int) -> None:
        self._cancel_requested.add(request_id)

    def cancelled(self, lanes: Iterable[Lane], check: Callable[[int], bool] | None) -> list[Lane]:
        """The lanes to cancel now: asked for by `cancel`, or by `check` (the server's view of
        disconnected clients)."""
        out = [
            lane
            for lane in lanes
            if lane.request_id in self._cancel_requested
            or (check is not None and check(lane.request_id))
        ]
        self._cancel_requested.clear()  # ids of ended or unknown requests are dropped too
        return out
