"""Reasoning text apart from the answer: what a thinking model (Qwen3, Qwen3.5, DeepSeek-R1, ...)
writes between `<think>` and `</think>` becomes the chat message's `reasoning_content`, as vLLM's
reasoning parsers return it; the rest is `content` (and what tool-call parsing reads).

Two shapes, told apart per request from the prompt: where the chat template opens the block in
the prompt itself (its generation prompt ends with `<think>`: DeepSeek-R1's, Qwen3's thinking
templates in some versions), the output starts inside the reasoning and only `</think>` appears;
otherwise reasoning is a `<think>` block at the start of the output. A block never closed (the
output ran out) is reasoning to its end. Chosen with `--reasoning-parser` (vLLM's names), or by
default for a chat template that writes `<think>`.
"""

from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"
PARSERS = ("qwen3", "deepseek_r1", "deepseek_v3", "granite", "glm45", "none")


def template_thinks(template: str | None) -> bool:
    """A chat template that writes reasoning blocks (so reasoning is parsed by default)."""
    return bool(template) and OPEN in template and CLOSE in template


def opens_in_prompt(prompt_tail: str) -> bool:
    """Whether the prompt's end (its last tokens, decoded) opens a reasoning block."""
    return prompt_tail.rstrip().endswith(OPEN)


def split_reasoning(text: str, inside: bool) -> tuple[str | None, str]:
    """(reasoning or None, content) of a whole output; `inside`: the prompt opened the block."""
    if not inside:
        stripped = text.lstrip()
        if not stripped.startswith(OPEN):
            return None, text
        text, inside = stripped[len(OPEN) :], True
    reasoning, closed, content = text.partition(CLOSE)
    return reasoning, content.lstrip() if closed else ""


class ReasoningStream:
    """split_reasoning over a stream: each piece of text gives (reasoning delta, content delta);
    a tag cut between two pieces is held back until it is whole."""

    def __init__(self, inside: bool) -> None:
        self.state = "reasoning" if inside else "start"  # start -> reasoning -> content
        self.held = ""
        self.after_close = False  # the content after </think> starts past its blank lines

    def feed(self, piece: str) -> tuple[str, str]:
        text, self.held = self.held + piece, ""
        reasoning = content = ""
        if self.state == "start":
            stripped = text.lstrip()
            if OPEN.startswith(stripped) and len(stripped) < len(OPEN):
                self.held = text  # maybe the opening tag, cut
                return "", ""
            if not stripped.startswith(OPEN):
                self.state = "content"
                return "", text
            self.state, text = "reasoning", stripped[len(OPEN) :]
        if self.state == "reasoning":
            before, closed, after = text.partition(CLOSE)
            if not closed:
                keep = _partial_suffix(text, CLOSE)
                self.held = text[len(text) - keep :] if keep else ""
                return text[: len(text) - keep], ""
            reasoning, text, self.state, self.after_close = before, after, "content", True
        if self.after_close:
            text = text.lstrip()
            self.after_close = not text
        content = text
        return reasoning, content

    def flush(self) -> tuple[str, str]:
        """What is held at the end: a cut tag that never completed is text of its state."""
        held, self.held = self.held, ""
        if self.state == "reasoning":
            return held, ""
        return "", held


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of tag."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
