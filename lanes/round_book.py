"""The round book: every round, planned or not, is written down once — its device time for the
share allocator (lanes/round_clock.py, lanes/share.py) and its counts for the metrics.

`last_end` is the engine clock when the latest round ended: rounds launched without a plan
(overlapped, device rounds) take their wall time from it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from lanes.metrics import EngineMetrics, RoundRecord
from lanes.round_clock import RoundClock
from lanes.share import ShareAllocator


class RoundBook:
    def __init__(
        self,
        share: ShareAllocator,
        metrics: EngineMetrics,
        on_cuda: bool,
        clock: Callable[[], float],
    ) -> None:
        self.share = share
        self.metrics = metrics
        self.clock = clock
        self.round_clock = RoundClock(on_cuda)
        self.last_end = clock()

    def begin(self) -> torch.cuda.Event | None:
        """Mark a round's start on the device (before its first launch)."""
        return self.round_clock.begin()

    def ended(self) -> float:
        """The round ends now: the seconds since the last one ended."""
        now = self.clock()
        seconds, self.last_end = now - self.last_end, now
        return seconds

    def record(
        self,
        mark: torch.cuda.Event | None,
        prefill_tokens: int,
        decode_tokens: int,
        seconds: float,
        *,
        num_forwards: int = 1,
        host_seconds: float = 0.0,
        prefill_share: float = 0.0,
        overlapped: bool = False,
        drafts: int = 0,
        drafter_seconds: float = 0.0,
        device_round: bool = False,
    ) -> None:
        """A round's device time from `mark` (RoundBook.begin; None: `seconds` of wall time)
        and its record. A round launched without a plan counts no host time: its planning and
        taking ran while a forward did."""
        self.round_clock.end(mark, prefill_tokens, decode_tokens, seconds)
        for prefill, decode, measured in self.round_clock.measured():  # known by now
            self.share.record(prefill, decode, measured)
        self.metrics.achieved_prefill_share = self.share.achieved_share
        self.metrics.add(
            RoundRecord(
                prefill_tokens=prefill_tokens,
                decode_tokens=decode_tokens,
                num_forwards=num_forwards,
                seconds=seconds,
                host_seconds=host_seconds,
                prefill_share=prefill_share,
                overlapped=overlapped,
                drafts=drafts,
                drafter_seconds=drafter_seconds,
                device_round=device_round,
            )
        )
