"""Overlapped rounds: round N+1 is launched on round N's tokens while they are still on the
device, and only then are N's tokens taken (lanes/inflight.py draws the timeline).

Contract: `step()` takes the round in flight and, where nothing needs a planned round, leaves the
next one in flight; it returns (the lanes that ended, whether a round is in flight now). When
none is, the engine plans a round as usual. A lane that ended since N was launched is skipped;
output equals the synchronous path's (tested).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from lanes.drafting import Drafting
from lanes.inflight import InFlight
from lanes.output import Completion, Output
from lanes.round_book import RoundBook
from lanes.round_execution import RoundExecution
from lanes.rounds import Step, lane_rows
from lanes.scheduler import Scheduler

log = logging.getLogger("lanes")


class Overlap:
    def __init__(
        self,
        execution: RoundExecution,
        scheduler: Scheduler,
        drafting: Drafting,
        output: Output,
        book: RoundBook,
        *,
        hybrid: bool,
        device_rounds_due: Callable[[], bool],
    ) -> None:
        self.execution = execution
        self.scheduler = scheduler
        self.drafting = drafting
        self.output = output
        self.book = book
        self.hybrid = hybrid
        self.device_rounds_due = device_rounds_due

    def step(self) -> tuple[list[Completion], bool]:
        """Launch round N+1 on round N's device tokens, then take round N's tokens (waiting for
        N alone)."""
        ex = self.execution
        last, ex.inflight = ex.inflight, None
        steps: tuple[Step, ...] = ()
        mark = self.book.begin()
        try:
            steps = self._steps_on_top(last)
            if steps:
                logits = ex.runner.execute(lane_rows(steps), previous_tokens=last.tokens)
                ex.inflight = ex.launch(steps, logits)
        except Exception:  # the planned round reruns these lanes with its own boundaries
            log.exception("launching a round on top of the previous one failed")
            ex.inflight = None
        ended = self._take(last)
        ended += ex.cancellations()
        if ex.inflight is None:
            return ended, False
        seconds = self.book.ended()
        self.drafting.record_plain_round(seconds)  # a plain round, as it runs overlapped
        self.book.record(mark, 0, len(steps), seconds, overlapped=True)
        return ended, True

    def _steps_on_top(self, last: InFlight) -> tuple[Step, ...]:
        """Each live lane of `last` decodes its pending token next, if nothing else needs a
        planned round: no lane waits to be admitted, every running lane is in `last`, and the
        blocks fit. A lane that ends by length in `last` gets no step."""
        sched = self.scheduler
        live = [(i, s) for i, s in enumerate(last.steps) if not s.lane.is_finished]
        if sched.waiting or len(live) != len(sched.running):
            return ()
        self.drafting.device_due = self.device_rounds_due()
        if self.drafting.device_due:  # a planned round starts them
            return ()
        num_decoding = len(live)
        if any(self.drafting.num_drafts(s.lane, num_decoding) for _, s in live):
            return ()  # a drafter needs the newest token
        if self._snapshot_due([s for _, s in live]):
            return ()
        steps = [
            Step(s.lane, s.end, s.end + 1, num_logits=1, pending_row=i)
            for i, s in live
            if s.lane.num_known + 1 < sched.max_len(s.lane)
        ]
        if not sched.reserve([s.lane for s in steps], [s.end for s in steps]):
            return ()
        return tuple(steps)

    def _snapshot_due(self, steps: list[Step]) -> bool:
        """Hybrids: a step ends on a block boundary, where its lane's state is kept as a snapshot
        when its tokens are taken; a round launched on top first would move the state on."""
        bs = self.scheduler.config.block_size
        return self.hybrid and any(s.end % bs == 0 for s in steps)

    def _take(self, last: InFlight) -> list[Completion]:
        """Append the tokens of a launched round to its lanes (skipping lanes that ended since)."""
        tokens, logprobs = last.results()
        now = self.execution.clock()
        ended = []
        rows = None if last.hidden is None else last.hidden.split(1)  # one call, not a slice each
        for i, (s, token, logprob) in enumerate(zip(last.steps, tokens, logprobs, strict=True)):
            if s.lane.is_finished:
                continue
            hidden = None if rows is None else rows[i]
            try:
                done = self.execution.take_tokens(s, [(token, logprob, None)], hidden, now)
            except Exception as e:
                ended.append(self.output.fail(s.lane, e))
                continue
            if done is not None:
                ended.append(done)
        self.execution.progress()
        return ended
