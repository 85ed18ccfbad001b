"""Incremental detokenization: stream text as tokens arrive, never half a character."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lanes.tokenizer import Tokenizer

# Decoding starts a few tokens before the new ones so that tokenizers which drop a leading space
# when a token starts the text (SentencePiece) still give the right spacing.
_CONTEXT_TOKENS = 5
_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Decode a growing list of ids into text, a piece per push.

    Keeps two offsets into `ids`: text up to `read_offset` has been emitted, and decoding restarts
    at `prefix_offset` (a little before). A push decodes [prefix_offset:] and emits what extends the
    already emitted [prefix_offset:read_offset] text, unless it ends in U+FFFD: then the last token
    ends inside a multi-byte character, and the text waits for the next token.

        ids:  p p p p p | o o o
                ^prefix   ^read
    """

    def __init__(self, tokenizer: Tokenizer, prompt_ids: list[int]) -> None:
        self.tokenizer = tokenizer
        self.ids = list(prompt_ids[-_CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.text = ""

    def push(self, token_id: int) -> str:
        """Add one id; return the text it completes (possibly empty)."""
        self.ids.append(token_id)
        return self._advance(final=False)

    def flush(self) -> str:
        """At the end of the stream: emit whatever is left, incomplete characters included."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        decode = self.tokenizer.decode
        before = decode(self.ids[self.prefix_offset : self.read_offset])
        full = decode(self.ids[self.prefix_offset :])
        if len(full) <= len(before) or (full.endswith(_REPLACEMENT) and not final):
            return ""
        new = full[len(before) :]
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.ids)
        self.text += new
        return new
