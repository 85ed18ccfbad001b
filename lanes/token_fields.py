"""The per-token fields a request may ask for beside each choice's text: vLLM's `token_ids`
(`"return_token_ids": true`) and lanes' `draft_spans` (`"return_draft_spans": true`: the text in
runs of accepted drafts and the target's own tokens, lanes/draft_spans.py)."""

from __future__ import annotations

from lanes.draft_spans import StreamedSpans, draft_spans


class TokenFields:
    def __init__(self, token_ids: bool, spans: bool) -> None:
        self.token_ids, self.spans = token_ids, spans
        self._streamed: dict[int, StreamedSpans] = {}  # choice -> its spans so far

    @property
    def asked(self) -> bool:
        return self.token_ids or self.spans

    def of_delta(self, i: int, delta) -> dict:
        """The fields of choice i's streamed piece (a lanes.async_engine.Delta)."""
        out: dict = {}
        if self.token_ids:
            out["token_ids"] = list(delta.token_ids)
        if self.spans:
            spans = self._streamed.setdefault(i, StreamedSpans())
            out["draft_spans"] = spans.feed(delta.text, delta.text_ends, delta.from_draft)
        return out

    def of_completion(self, c) -> dict:
        """The fields of a whole choice (a lanes.output.Completion)."""
        out: dict = {}
        if self.token_ids:
            out["token_ids"] = list(c.token_ids)
        if self.spans:
            out["draft_spans"] = draft_spans(c.text, 0, c.text_ends, c.from_draft)
        return out
