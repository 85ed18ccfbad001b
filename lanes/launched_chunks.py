"""Prompt chunks launched on the device whose forwards the host has not yet seen complete.

A mid-prompt chunk samples nothing, so nothing makes the host wait for it: left alone, the host
would queue a whole long prompt in milliseconds, and a cancel arriving later would save no GPU
time. Each chunk forward records an event; after launching chunk N the engine waits for the
event of chunk N-1 only. So one chunk stays queued behind the running one (the GPU does not
idle while the host launches the next), and a cancel waits for at most the chunk in flight.

A chunk's positions count as computed (`Lane.num_computed`, what cancel_prefill, preemption and
finished requests publish to the prompt cache) only once its event has completed: the prompt
cache never offers blocks the device has not written.

    host:   launch c1 | launch c2, wait c1 | launch c3, wait c2 | ... | wait c_last
    device: [   c1    ][        c2        ][        c3        ] ...
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol

from lanes.lane import Lane


class Event(Protocol):  # torch.cuda.Event's part used here
    def record(self) -> None: ...
    def synchronize(self) -> None: ...


class LaunchedChunks:
    def __init__(self, make_event: Callable[[], Event] | None) -> None:
        """make_event: torch.cuda.Event on CUDA; None where a forward has completed when it
        returns (the CPU), so chunks count as computed at once."""
        self._make_event = make_event
        self._queue: deque[tuple[list[tuple[Lane, int]], Event | None]] = deque()

    def __len__(self) -> int:
        return len(self._queue)

    def launched(self, ends: Sequence[tuple[Lane, int]]) -> None:
        """A forward computing each lane's positions up to `end` was launched."""
        if not ends:
            return
        event = None
        if self._make_event is not None:
            event = self._make_event()
            event.record()
        self._queue.append((list(ends), event))
        if event is None:
            self.settle()

    def settle(self, keep: int = 0) -> None:
        """Wait for all but the newest `keep` launched chunk forwards; their lanes' positions
        count as computed."""
        while len(self._queue) > keep:
            ends, event = self._queue.popleft()
            if event is not None:
                event.synchronize()
            for lane, end in ends:
                if not lane.is_finished:  # a lane that failed in the same forward is gone
                    lane.num_computed = max(lane.num_computed, end)
