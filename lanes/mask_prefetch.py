"""Grammar masks computed while the forward runs.

A structured-output lane's mask for logits row j is a function of its output and the drafts
before row j — all known once the round is planned and its drafts are filled, before the forward
starts. So the engine hands the round's grammar rows to a helper thread (llguidance computes a
mask with the GIL released) and takes each mask when it samples that row: the engine thread waits
only for what the forward did not cover. Rows after a draft the grammar forbids are never
needed (that row's sample cannot equal the draft), so the helper stops there, as sampling does.

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
        self._jobs: dict[int, Future] = {}  # request id -> its rows' (history, mask) pairs

    def start(self, steps: Sequence[Step]) -> None:
        """Begin computing the masks of every sampled row of these steps' grammar lanes."""
        if not self.enabled:
            return
        for s in steps:
            cursor = s.lane.grammar_cursor
            if cursor is None or not s.num_logits or s.lane.request_id in self._jobs:
                continue
            if self._threads is None:
                self._threads = DeepStackThreads(1, "lanes-masks")
            output = list(s.lane.output_ids)
            histories = [output + list(s.draft_ids[:j]) for j in range(s.num_logits)]
            self._jobs[s.lane.request_id] = self._threads.submit(
                lambda c=cursor, h=histories: _masks(c, h)
            )

    def allowed(self, lane: Lane, history: list[int]) -> torch.Tensor:
        """The lane's mask after `history`: the prefetched one, else computed now."""
        start = time.perf_counter()
        try:
            job = self._jobs.get(lane.request_id)
            if job is not None:
                for seen, mask in job.result():
                    if seen == history:
                        if isinstance(mask, Exception):  # that row's grammar failure
                            raise mask
                        return mask
            return lane.grammar_cursor.allowed(history)
        finally:
            lane.mask_seconds += time.perf_counter() - start

    def finish_round(self) -> None:
        """Forget this round's jobs, once each is done (a lane that ended mid-round may still
        have one running: its cursor is left alone until it ends)."""
        for job in self._jobs.values():
            job.result()
        self._jobs.clear()


def _masks(cursor, histories: list[list[int]]) -> list[tuple[list[int], torch.Tensor | Exception]]:
    """Each row's mask in turn, up to the first draft the grammar forbids or the first failure
    (kept for that row: a row the target never samples fails nothing). Helper thread."""
    out: list[tuple[list[int], torch.Tensor | Exception]] = []
    for j, history in enumerate(histories):
        try:
            mask = cursor.allowed(history)
        except Exception as e:
            out.append((history, e))
            break
        out.append((history, mask))
        if j + 1 < len(histories) and not bool(mask[histories[j + 1][-1]]):
            break
    return out
