"""Grammar masks computed off the engine thread's critical path.

A structured-output lane's next mask — the one after its output so far, which every step it takes
samples first — is known as soon as its last tokens are. So before each round's forward the engine
hands every running grammar lane's next mask to a helper thread (llguidance computes a mask with
the GIL released), and sampling takes it from there: the engine thread waits only for what the
forward, and the rounds a lane rests (lanes/mask_budget.py), did not cover. The rows behind drafts
are computed when sampling reaches them, as far as the drafts are accepted (masking them all
ahead cost more than it hid on an H200, bench/NOTES.md).

A lane's cursor is touched by one thread at a time: jobs run one after another on the single
helper thread, a lane has at most one job (a newer one queued behind the older), and the engine
thread reaches a cursor only through `allowed`, which first waits for the lane's job. What the
engine thread waited (or computed itself) is added to the lane's `mask_seconds`: the exposed mask
time lanes.mask_budget charges.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from concurrent.futures import Future

import torch

from lanes.deep_stack import DeepStackThreads
from lanes.lane import Lane


class MaskPrefetch:
    def __init__(self, enabled: bool = True) -> None:
        """enabled False: every mask is computed on the engine thread when sampling asks."""
        self.enabled = enabled
        self._threads: DeepStackThreads | None = None  # started at the first grammar lane
        self._jobs: dict[int, tuple[list[int], Future]] = {}  # request id -> (history, mask)

    def start(self, lanes: Iterable[Lane]) -> None:
        """Begin computing each grammar lane's mask after its output so far (unless begun)."""
        if not self.enabled:
            return
        for lane in lanes:
            cursor = lane.grammar_cursor
            if cursor is None or lane.is_finished:
                continue
            history = list(lane.output_ids)
            job = self._jobs.get(lane.request_id)
            if job is not None and job[0] == history:
                continue
            if self._threads is None:
                self._threads = DeepStackThreads(1, "lanes-masks")
            future = self._threads.submit(lambda c=cursor, h=history: _mask(c, h))
            self._jobs[lane.request_id] = (history, future)

    def allowed(self, lane: Lane, history: list[int]) -> torch.Tensor:
        """The lane's mask after `history`: the prefetched one, else computed now."""
        start = time.perf_counter()
        try:
            job = self._jobs.get(lane.request_id)
            if job is not None:
                mask = job[1].result()  # the cursor is the engine thread's again after this
                if job[0] == history:
                    if isinstance(mask, Exception):  # that row's grammar failure
                        raise mask
                    return mask
            return lane.grammar_cursor.allowed(history)
        finally:
            lane.mask_seconds += time.perf_counter() - start

    def forget(self, request_id: int) -> None:
        """A lane that ended (a job of its may still run: nothing else uses its cursor)."""
        self._jobs.pop(request_id, None)


def _mask(cursor, history: list[int]) -> torch.Tensor | Exception:
    """The mask after `history`, or the grammar's failure there, kept for the engine thread to
    raise if it samples that row (helper thread)."""
    try:
        return cursor.allowed(history)
    except Exception as e:
        return e
