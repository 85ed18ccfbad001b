"""Drafted rounds on the device, as the engine drives them: when to start them, each round's
tokens mirrored into the lanes, and when to stop (lanes/device_rounds.py runs the rounds).

Contract:
- They start only from a planned round of decode steps of every running lane, nothing waiting
  or filling, each lane drafting and sampled on the device, with blocks for the positions the
  next round may write (`fits`).
- `step()` launches the next round while every lane can go on, then takes the oldest in flight;
  otherwise it takes them all and stops: live lanes' heads take their pending features back and
  blocks past their known tokens return to the pool.
- With cost-aware drafts they are judged against a plain round's measured time and pause (for
  the same requests) where they do not pay; they do not start where the lanes' acceptance
  predicts a clear loss at this lane count (`DeviceRoundCosts.predicts_loss`), except every
  `retry_every` rounds (DEVICE_RETRY, doubled by each pause at that lane count). A lane
  they could carry is not drafted host-managed meanwhile (`declines`): on the engines that
  have them a host-managed drafted round costs several device rounds (H200, 16 lanes: 6.5-30
  ms against 2.6 ms), so where they do not pay, it pays less; nor does the head compute prompt
  chunks then (`skips_prefill`; it catches up when it drafts).
- A launch that raises turns them off for this engine (logged); what is in flight is still
  taken.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from lanes.draft_costs import DEVICE_MEASURE, DEVICE_PAUSE, DEVICE_STALE, DeviceRoundCosts
from lanes.drafting import Drafting
from lanes.lane import Lane, LaneState
from lanes.output import Completion, Output
from lanes.round_book import RoundBook
from lanes.rounds import LaneRound
from lanes.scheduler import Scheduler
from lanes.verifier import Verifier

log = logging.getLogger("lanes")


class DeviceRoundDriver:
    def __init__(
        self,
        device_rounds,  # lanes.device_rounds.DeviceRounds, or None: rounds stay host-managed
        scheduler: Scheduler,
        output: Output,
        drafting: Drafting,
        verifier: Verifier,
        book: RoundBook,
        *,
        overlap: bool,
        progress: Callable[[], None],
        cancellations: Callable[[], list[Completion]],
    ) -> None:
        self.device_rounds = device_rounds
        self.scheduler = scheduler
        self.output = output
        self.drafting = drafting
        self.verifier = verifier
        self.book = book
        self.metrics = drafting.metrics
        self.overlap = overlap
        self.progress = progress
        self.cancellations = cancellations
        self.broken = False
        self.costs = DeviceRoundCosts()  # whether they pay here (with cost-aware drafts)
        # judged not to pay for these requests: not started again before this
        # metrics.num_rounds while only they run (new requests are judged afresh)
        self.paused_until = 0
        self.paused_for: frozenset[int] = frozenset()
        self.started_at = 0  # metrics.num_rounds when they last started

    @property
    def active(self) -> bool:
        return self.device_rounds is not None and bool(self.device_rounds.lanes)

    def _carries(self, lane: Lane) -> bool:
        """A lane the device rounds can carry now: drafting, sampled on the device, and far
        enough from the end of its context that the next two rounds stay within it. (Rounds
        past max_tokens are fine: their positions are computed, but no token past the end is
        emitted, and the lane ends there.)"""
        dr = self.device_rounds
        return (
            not lane.is_finished
            and lane.state is LaneState.DECODE
            and self.drafting.drafting(lane)
            and self.verifier.samples_on_device(lane.params)
            and dr.reach(lane) <= min(dr.target.max_ctx, dr.head.max_ctx)
        )

    def _paused(self) -> bool:
        return self.metrics.num_rounds < self.paused_until and all(
            lane.request_id in self.paused_for for lane in self.scheduler.running
        )

    def _ready(self, lanes: Sequence[Lane]) -> bool:
        """These lanes are every running lane (one at least), nothing waits, and each is a device
        lane."""
        sched = self.scheduler
        return (
            bool(lanes)
            and not sched.waiting
            and len(lanes) == len(sched.running)
            and all(self._carries(lane) for lane in lanes)
        )

    def due(self) -> bool:
        """Whether device rounds could start now: not paused, the running lanes ready, and no
        clear loss predicted. Then plain overlapped rounds give way to a planned round, and
        cost-aware k does not stop drafting (device rounds judge their own cost)."""
        if self.device_rounds is None or self._paused():
            return False
        running = self.scheduler.running
        return self._ready(running) and not self._predicts_loss(running)

    def declines(self, lane: Lane) -> bool:
        """With cost-aware drafts, whether this lane is one device rounds could carry, so that
        it drafts only in them (asked where they are not due)."""
        return self.drafting.cost_aware and self.device_rounds is not None and self._carries(lane)

    def skips_prefill(self, num_lanes: int | None = None) -> bool:
        """With cost-aware drafts, whether device rounds predict a clear loss at the running
        lanes (or at `num_lanes` of them: the count a lane being admitted will run among), so
        that the head need not compute prompt chunks now (it catches up on them when it next
        drafts): on an H100 at 16 lanes its prompt prefill took 0.10 s of a 0.48 s drafted
        run where device rounds did not pay."""
        return self.device_rounds is not None and self._predicts_loss(
            self.scheduler.running, num_lanes
        )

    def _predicts_loss(self, lanes: Sequence[Lane], num_lanes: int | None = None) -> bool:
        """num_lanes: predicted at that many lanes, of the given lanes' mean acceptance (the
        engine's running acceptance where none is given)."""
        n = len(lanes) if num_lanes is None else num_lanes
        if not (self.drafting.cost_aware and n):
            return False
        if self.metrics.num_rounds - self.started_at >= self.costs.retry_every(n):
            return False  # measured again now and then: the acceptance may have moved
        d = self.drafting
        acceptance = (
            sum(
                lane.acceptance_ema if lane.num_verify_steps else d.acceptance_prior
                for lane in lanes
            )
            / len(lanes)
            if lanes
            else d.acceptance_prior
        )
        return self.costs.predicts_loss(n, acceptance, self.device_rounds.k, d.costs.forward)

    def _reserve_reach(self, lanes: Sequence[Lane]) -> bool:
        dr = self.device_rounds
        return self.scheduler.reserve(lanes, [dr.reach(lane) for lane in lanes])

    def take_over(self, plan: LaneRound) -> list[Completion] | None:
        """Run the planned round as device rounds where they can take it (decode steps of every
        running lane, each a device lane, blocks for their reach): the lanes that ended; None
        where the plan stays host-managed."""
        if self.device_rounds is None or plan.prefill or not plan.decode or self._paused():
            return None
        lanes = [s.lane for s in plan.decode]
        if not self._ready(lanes) or self._predicts_loss(lanes) or not self._reserve_reach(lanes):
            return None
        if self.device_rounds.start(lanes):
            self.started_at = self.metrics.num_rounds
            if self._launch():
                return self._round(launched=True, start=self.book.clock())
            self._stop()  # the head's pool is full: host-managed this round
        return None

    def step(self) -> list[Completion]:
        dr = self.device_rounds
        verdict = "go"
        if self.drafting.cost_aware:
            stale = self.metrics.num_rounds - self.drafting.forward_measured_at > DEVICE_STALE
            verdict = self.costs.verdict(self.drafting.costs.forward, stale)
        if verdict != "go":  # a plain round is faster, or was not measured (lately)
            self._pause(verdict)
        go_on = verdict == "go" and self._ready(dr.lanes) and self._reserve_reach(dr.lanes)
        return self._round(go_on and self._launch(), self.book.last_end)

    def _pause(self, verdict: str) -> None:
        c, forward = self.costs, self.drafting.costs.forward
        log.info(
            "device rounds %s: %.2f tokens per lane in %.2f ms per round; plain round %s",
            "paused" if verdict == "pause" else "stopped to measure a plain round",
            c.tokens,
            c.seconds * 1e3,
            "not measured" if forward is None else f"{forward * 1e3:.2f} ms",
        )
        if verdict == "pause":
            c.paused_at(len(self.device_rounds.lanes))
        pause = DEVICE_PAUSE if verdict == "pause" else DEVICE_MEASURE
        self.paused_until = self.metrics.num_rounds + pause
        self.paused_for = frozenset(lane.request_id for lane in self.device_rounds.lanes)

    def _launch(self) -> bool:
        try:
            return self.device_rounds.launch()
        except Exception:
            log.exception("launching a device round failed; drafted rounds are host-managed now")
            self.broken = True
            return False

    def _round(self, launched: bool, start: float) -> list[Completion]:
        """Take what the launch leaves to take, and end the rounds when none was launched."""
        dr = self.device_rounds
        ended, emitted = [], None  # emitted: tokens per lane of the last round taken
        # with overlap one round stays in flight while the host takes the one before it
        while len(dr.pending) > (1 if launched and self.overlap else 0):
            done, emitted = self._take()
            ended += done
        if not launched:
            self._stop()
        ended += self.cancellations()
        now = self.book.clock()
        seconds, self.book.last_end = now - start, now
        if launched:
            if emitted is not None:
                self.costs.record(emitted, seconds, len(dr.lanes))
            tokens = len(dr.lanes) * (dr.k + 1)
            self.book.record(
                None, 0, tokens, seconds, overlapped=self.overlap,
                drafts=len(dr.lanes) * dr.k, device_round=True,
            )  # fmt: skip
        return ended

    def _take(self) -> tuple[list[Completion], float | None]:
        """Mirror the oldest device round into its lanes (skipping lanes that ended since):
        the lanes that ended, and the round's tokens per live lane (None: no lane was)."""
        dr = self.device_rounds
        results = dr.take()
        now = self.book.clock()
        ended, emitted = [], []
        for lane, r in zip(dr.lanes, results, strict=True):
            if lane.is_finished:
                continue
            emitted.append(r.accepted + 1)
            try:
                if r.verify_start != lane.num_known - 1:
                    raise RuntimeError(
                        f"device round verified from position {r.verify_start}; the lane's "
                        f"newest token is at {lane.num_known - 1}"
                    )
                lane.num_sampling_steps += 1
                self.drafting.record_verify(lane, dr.k, r.accepted)
                self.drafting.metrics.num_branches_followed += r.branch > 0
                dr.drafter.device_settle(lane, r.verify_start)
                for token, logprob in r.emitted:
                    self.output.append(lane, token, logprob, None, now)
                    if lane.finish_reason is not None:
                        break
                lane.num_computed = lane.num_known - 1
            except Exception as e:
                ended.append(self.output.fail(lane, e))
                continue
            if lane.finish_reason is not None:
                ended.append(self.output.end(lane, LaneState.DONE))
        self.progress()
        return ended, (sum(emitted) / len(emitted) if emitted else None)

    def _stop(self) -> None:
        dr = self.device_rounds
        live = [lane for lane in dr.lanes if not lane.is_finished]
        dr.stop({i for i, lane in enumerate(dr.lanes) if not lane.is_finished})
        for lane in live:
            self.scheduler.trim(lane)
            self.drafting.accepted(lane)
        if self.broken:
            self.device_rounds = None
        self.costs.restart()  # judged afresh when they start again
