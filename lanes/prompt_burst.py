"""Bursts: when prompt work takes each round's whole token budget although lanes decode.

The share allocator (lanes/share.py) gives prompt work `--prefill-share` of a round's wall time
while decode lanes run. That protects the inter-token latency of lanes that decode while a
long prompt arrives among them. When many requests arrive together it helps no one: the first
lanes to finish their prompts decode in small batches, and every prompt still waiting, spread
over many mixed rounds, gets its first token later. On the H200, 64 requests arriving together
ran at 3,216 output tok/s with the share at 0.5 and 4,681 at 1.0, and waited longer for their
first tokens at 0.5 (issue 42).

The rule: when at least as many lanes wait for their first token as decode, the prompts
waiting at that moment are a burst, and rounds give prompt work their whole token budget until
every one of them has been computed (or has left). Lanes that arrive during a burst do not
extend it; they are judged when it ends. A long prompt arriving among many decoding lanes is
not a burst, so the share holds there. Which round a prompt chunk lands in changes, never a
token: a row's bits do not depend on what else shares its forward.
"""

from __future__ import annotations

from collections.abc import Set


class PromptBurst:
    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._members: set[int] = set()  # request ids of the burst's prompts not yet computed

    def active(self, waiting: Set[int], num_decode: int) -> bool:
        """Whether this round's prompt work takes the whole budget. waiting: request ids of
        the lanes without a first token (filling or queued); num_decode: lanes decoding."""
        if not self.enabled:
            return False
        self._members &= waiting  # computed or gone: no longer part of the burst
        if not self._members and waiting and len(waiting) >= num_decode:
            self._members = set(waiting)
        return bool(self._members)
