"""What a round costs on the device, for the share allocator (lanes/share.py).

On CUDA a round is timed by two events: one recorded before its first launch, one after its
last. The first is reached when the device starts the round's work (after the rounds still
queued before it, which overlapped rounds leave running), so consecutive rounds' spans tile the
device's timeline without counting anything twice, and the host's planning between rounds is
not charged to either. Reading a span needs its end event completed; spans are handed out once
they have, which for an overlapped round is a round later. Where no events exist (the CPU, or a
round that times itself), the host's wall time stands in.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass
class _Timed:
    prefill_tokens: int
    decode_tokens: int
    seconds: float  # wall seconds, used when there are no events
    start: torch.cuda.Event | None
    end: torch.cuda.Event | None


class RoundClock:
    def __init__(self, on_cuda: bool) -> None:
        self._make_event: Callable[[], torch.cuda.Event] | None = None
        if on_cuda:
            self._make_event = lambda: torch.cuda.Event(enable_timing=True)
        self._pending: deque[_Timed] = deque()

    def begin(self) -> torch.cuda.Event | None:
        """Mark the start of a round's device work (before its first launch)."""
        if self._make_event is None:
            return None
        start = self._make_event()
        start.record()
        return start

    def end(
        self,
        start: torch.cuda.Event | None,
        prefill_tokens: int,
        decode_tokens: int,
        wall_seconds: float,
    ) -> None:
        """Mark the end of the round begun at `start` (after its last launch); without a start
        the wall seconds are the round's cost."""
        end = None
        if start is not None:
            end = self._make_event()
            end.record()
        self._pending.append(_Timed(prefill_tokens, decode_tokens, wall_seconds, start, end))

    def measured(self) -> list[tuple[int, int, float]]:
        """(prefill tokens, decode tokens, seconds) of the rounds whose device work has
        completed, oldest first; never waits."""
        out = []
        while self._pending:
            t = self._pending[0]
            if t.end is not None and not t.end.query():
                break
            self._pending.popleft()
            seconds = t.seconds if t.end is None else t.start.elapsed_time(t.end) / 1e3
            out.append((t.prefill_tokens, t.decode_tokens, seconds))
        return out
