"""Grammar masks computed while the forward runs.

A structured-output lane's mask for logits row j is a function of its output and the drafts
before row j — all known once the round is planned, before the forward starts. The first row of
each step is always sampled, so the engine hands it to a helper thread (llguidance computes a
mask with the GIL released) and takes the mask when it samples that row: the engine thread waits
only for what the forward did not cover. The rows behind drafts are computed when sampling
reaches them, as far as the drafts are accepted (masking them all ahead cost more than it hid).

A lane's cursor is touched by one thread at a time: jobs run one after another on the single
helper thread, and the engine thread reaches a cursor only through `allowed`, which first waits
for the lane's job. What the engine thread waited (or computed itself) is added to the lane's
`mask_seconds`: the exposed mask time lanes.mask_budget charges.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import Future

import torch

from lanes.deep_stack import DeepStackThreads
from lanes.lane import Lane
from lanes.rounds import Step


class MaskPrefetch:
    def __init__(self, enabled: bool = True) -> None:
        """enabled False: every mask is computed on the engine thread when sampling asks."""
        self.enabled = enabled
        self._threads: DeepStackThreads | None = None  # started at the first grammar lane
        self._jobs: dict[int, Future] = {}  # request id -> (history, its mask)

    def start(self, steps: Sequence[Step]) -> None:
        """Begin computing the first row's mask of each of these steps' grammar lanes."""
        if not self.enabled:
            return
        for s in steps:
            cursor = s.lane.grammar_cursor
            if cursor is None or not s.num_logits or s.lane.request_id in self._jobs:
                continue
            if self._threads is None:
                self._threads = DeepStackThreads(1, "lanes-masks")
            # Only the first row: it is always sampled, while the rows behind drafts are needed
            # only as far as the drafts are accepted (masking them all ahead, on an H200: the
            # grammar request 1.4-1.6x slower, bench/NOTES.md)
            history = list(s.lane.output_ids)
            self._jobs[s.lane.request_id] = self._threads.submit(
                lambda c=cursor, h=history: (h, _mask(c, h))
            )

    def allowed(self, lane: Lane, history: list[int]) -> torch.Tensor:
        """The lane's mask after `history`: the prefetched one, else computed now."""
        start = time.perf_counter()
        try:
            job = self._jobs.get(lane.request_id)
            if job is not None:
                seen, mask = job.result()
                if seen == history:
                    if isinstance(mask, Exception):  # that row's grammar failure
                        raise mask
                    return mask
            return lane.grammar_cursor.allowed(history)
        finally:
            lane.mask_seconds += time.perf_counter() - start

    def finish_round(self) -> None:
        """Forget this round's jobs once each is done (that of a lane that ended mid-round may
        still be running: no cursor is left in a helper's hands past the round)."""
        for job in self._jobs.values():
            job.result()
        self._jobs.clear()


def _mask(cursor, history: list[int]) -> torch.Tensor | Exception:
    """The mask after `history`, or the grammar's failure there, kept for the engine thread to
    raise if it samples that row (helper thread)."""
    try:
        return cursor.allowed(history)
    except Exception as e:
        return e
