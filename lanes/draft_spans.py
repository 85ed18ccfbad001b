"""Draft spans: an output's text cut into runs of characters whose tokens were, or were not,
accepted drafts — what a client asks for with `"return_draft_spans": true` (the console
highlights them).

A lane records, per output token, whether it was a kept draft and where its text ends in the
output (lanes/output.py). Streams send text and tokens at different paces (text is held back
while a stop string may still cut it), so the spans of a chunk are found by character position:
a character belongs to the first token whose text ends after it; characters after every token's
end (a final flush of the detokenizer) belong to the last token.
"""

from __future__ import annotations

import bisect


def draft_spans(text: str, start: int, text_ends: list[int], from_draft: list[bool]) -> list:
    """Runs [piece, drafted] covering `text`, which begins at character `start` of the output;
    text_ends / from_draft: every output token's so far (not only this chunk's)."""
    spans: list = []
    pos, stop = start, start + len(text)
    i = bisect.bisect_right(text_ends, pos)
    while pos < stop:
        if i < len(text_ends):
            end, drafted = min(text_ends[i], stop), from_draft[i]
        else:
            end, drafted = stop, bool(from_draft and from_draft[-1])
        if end > pos:
            piece = text[pos - start : end - start]
            if spans and spans[-1][1] == drafted:
                spans[-1][0] += piece
            else:
                spans.append([piece, drafted])
            pos = end
        i += 1
    return spans


class StreamedSpans:
    """One streamed choice's spans, chunk by chunk: the token records and the characters sent
    so far, kept across the chunks."""

    def __init__(self) -> None:
        self.text_ends: list[int] = []
        self.from_draft: list[bool] = []
        self.sent = 0  # characters already covered

    def feed(self, text: str, text_ends: list[int], from_draft: list[bool]) -> list:
        """The spans of a chunk's `text`, given the tokens that arrived with it."""
        self.text_ends += text_ends
        self.from_draft += from_draft
        spans = draft_spans(text, self.sent, self.text_ends, self.from_draft)
        self.sent += len(text)
        return spans
