"""Drafting: how many drafts each decode lane gets, asking the proposer for them, and keeping the
drafter in step with the target (prompt chunks, features, verified lengths).

Contract:
- `num_drafts(lane, num_decoding)` is the lane's draft slots for the round being planned:
  adaptive k from its running acceptance, within what it may still emit, and — with cost-aware
  drafts — only as many as pay for themselves by the measured costs (lanes/draft_costs.py).
  It changes speed only: coupled verification gives the same tokens for any k.
- `round_drafts(running)` is that for every lane of one round: where the target's forwards are
  graph replays (`even_drafts`), every drafting lane gets the most any of them gets, so that
  the verify replays one graph instead of running eagerly; a lane that would not draft by the
  costs drafts one token in every `probe_every`-th round, all such lanes in the same round.
- `fill(plan)` turns planned decode steps into verify steps holding the proposer's drafts (host
  ids, or rows still on the device).
- `record_verify` keeps a lane's draft counts and running acceptance after its verify step, and
  the engine's running acceptance over all lanes: a lane not yet verified drafts by that, so
  where drafts are seldom kept (a weak head for this model or this traffic) a new request does
  not spend its first rounds learning it again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch

from lanes.config import EngineConfig
from lanes.draft_costs import (
    PLAIN_EVERY,
    PROBE_EVERY,
    PROBE_EVERY_SELDOM,
    PROBE_KEEN,
    DraftCosts,
)
from lanes.drafter import Proposer
from lanes.lane import Lane, LaneState
from lanes.lane_view import Chunk
from lanes.metrics import EngineMetrics, add_counts
from lanes.rounds import LaneRound, Step

_EMA = 0.3  # weight of the newest verify step in a lane's running acceptance
_MIN_USE = 0.2  # draft k tokens while the k-th one still has this chance of being kept
_PRIOR_EMA = 0.1  # weight of a verify step in the engine's running acceptance (all lanes)


class Drafting:
    def __init__(
        self,
        config: EngineConfig,
        proposer: Proposer | None,
        metrics: EngineMetrics,
        max_len: Callable[[Lane], int],
        clock: Callable[[], float],
        *,
        cost_aware: bool,
        device_drafts: bool,
        even_drafts: bool = False,
        branches: int = 1,
    ) -> None:
        """device_drafts: drafts left on the device may feed the verify forward directly (not
        with tensor parallelism, whose ranks take host ids). even_drafts: the target's forwards
        are graph replays, which take one token count for all lanes (`round_drafts`).
        branches: draft branches per lane the target's runner can verify (1: chains)."""
        self.config = config
        self.proposer = proposer
        self.metrics = metrics
        self.max_len = max_len
        self.clock = clock
        self.cost_aware = cost_aware
        self.device_drafts = device_drafts
        self.even_drafts = even_drafts
        self.branches = branches
        self.costs = DraftCosts()  # what drafting costs here, measured (adaptive k)
        self.acceptance_prior = Lane.acceptance_ema  # running acceptance over all lanes
        self.forward_measured_at = 0  # metrics.num_rounds at the last plain round measured
        # device rounds could start at the round being planned: they judge their own cost, so
        # cost-aware k does not stop drafting then
        self.device_due = False
        # ... and where they are not due, whether a lane is one they could carry, so that it
        # drafts only in them (lanes/device_round_driver.py: DeviceRoundDriver.declines)
        self.device_declines: Callable[[Lane], bool] = lambda lane: False
        # the drafter may skip prompt chunks while drafting cannot pay (`prefill`); not where
        # device rounds may run, which start from the drafter's computed rows, unless they
        # predict a loss at the running lanes (`device_skips_prefill`: the driver's judgement)
        self.lazy_prefill = True
        self.device_skips_prefill: Callable[..., bool] = lambda num_lanes=None: False

    @property
    def observing(self) -> bool:
        """The drafter reads the target's features (EAGLE-style)."""
        return self.proposer is not None and self.proposer.uses_target_hidden

    def drafting(self, lane: Lane) -> bool:
        return self.proposer is not None and lane.params.draft and self.config.num_draft_tokens > 0

    def num_drafts(self, lane: Lane, num_decoding: int) -> int:
        """Draft slots for a decode lane: adaptive k, within what the lane may still emit."""
        if not self.drafting(lane):
            return 0
        if not lane.num_verify_steps:  # nothing of its own measured yet
            lane.acceptance_ema = self.acceptance_prior
        cfg = self.config
        # asked of every drafting lane every round: the answer that needs least work first
        if cfg.adaptive_drafts and self.cost_aware and not self.device_due:
            if self.device_declines(lane):
                return 0
            k = self._paying_drafts(
                lane, choose_num_drafts(lane.acceptance_ema, cfg.num_draft_tokens), num_decoding
            )
            if not k:
                return 0
        elif cfg.adaptive_drafts:
            k = choose_num_drafts(lane.acceptance_ema, cfg.num_draft_tokens)
        else:
            k = cfg.num_draft_tokens
        return max(0, min(k, self._room(lane)))

    def round_drafts(self, running: Sequence[Lane]) -> Callable[[Lane, int], int]:
        """`num_drafts` for the round being planned over these lanes. With even drafts every
        drafting decode lane gets the most any of them gets (within its room): a round where
        some lanes draft and others do not, or draft fewer, has no graph and runs eagerly (on
        the H200, the default model at 64 lanes: ~17 ms a round where a replay takes ~1 ms),
        while an extra verify row costs a replay little."""
        decoding = [lane for lane in running if lane.state is LaneState.DECODE]
        n = len(decoding)
        if self._none_can_pay(n):  # one answer for the round, not a question per lane

            def none(lane: Lane, num_decoding: int) -> int:
                # asked at fewer lanes (the planner preempted some), which may pay: each lane
                # answers then, as without this shortcut (even drafts keep the round's answer)
                if self.even_drafts or num_decoding >= n:
                    return 0
                return self.num_drafts(lane, num_decoding)

            return none
        if not self.even_drafts:
            return self.num_drafts
        ks = {id(lane): self.num_drafts(lane, len(decoding)) for lane in decoding}
        most = max(ks.values(), default=0)
        if most:
            for lane in decoding:
                if self.drafting(lane):
                    ks[id(lane)] = max(0, min(most, self._room(lane)))

        def planned(lane: Lane, num_decoding: int) -> int:
            k = ks.get(id(lane))
            return self.num_drafts(lane, num_decoding) if k is None else k

        return planned

    def _none_can_pay(self, num_decoding: int) -> bool:
        """Whether every lane's cost-aware answer is 0 this round, whatever its acceptance:
        costs measured, no probe due, and no k pays at num_decoding lanes even were every
        draft kept (best_k grows with the acceptance). At load on an H100 that is most rounds,
        and asking each lane cost the host more than the round's own work at 16 lanes."""
        cfg, costs = self.config, self.costs
        return (
            self.proposer is not None
            and cfg.adaptive_drafts
            and self.cost_aware
            and not self.device_due
            and costs.measured
            and self.metrics.num_rounds % self.probe_every != 0
            and not costs.could_pay(cfg.num_draft_tokens, max(1, num_decoding))
        )

    @property
    def probe_every(self) -> int:
        """Rounds between probes: fewer where the engine's drafts are seldom kept."""
        return PROBE_EVERY if self.acceptance_prior >= PROBE_KEEN else PROBE_EVERY_SELDOM

    def _room(self, lane: Lane) -> int:
        """Drafts the lane may still verify: the target always adds one token."""
        return self.max_len(lane) - lane.num_known - 1

    def _paying_drafts(self, lane: Lane, k: int, num_decoding: int) -> int:
        """At most k drafts, as many as pay for themselves by the measured costs; plain rounds
        and one-token probes keep the costs measured."""
        costs = self.costs
        if costs.forward is None or self.metrics.num_rounds % PLAIN_EVERY == PLAIN_EVERY - 1:
            return 0  # this round measures what a round without drafts costs
        if not costs.measured:
            return k
        best = costs.best_k(lane.acceptance_ema, k, max(1, num_decoding))
        if best == 0 and self.metrics.num_rounds % self.probe_every == 0:
            # a probe: is this lane's acceptance still too low to pay? It also keeps the costs
            # measured where none would pay: probing less there (every 256th round) left a
            # transient bad measurement standing for hundreds of rounds (a CI run on 2 busy
            # cores stopped a drafter whose drafts were all right). Every lane probes in the
            # same round: lanes probing in rounds of their own made most rounds at 64 lanes
            # drafted ones (and, with graphs, eager ones)
            return 1
        return best

    def record_round(self, plan_decode: Sequence[Step], seconds: float, drafter_seconds: float):
        """A whole decode round's time, for the costs of drafting."""
        drafts = [s.num_drafted for s in plan_decode]
        self.costs.record(sum(drafts), max(drafts), seconds - drafter_seconds, drafter_seconds)
        if not sum(drafts):
            self.forward_measured_at = self.metrics.num_rounds

    def record_plain_round(self, seconds: float) -> None:
        self.costs.record(0, 0, seconds, 0.0)
        self.forward_measured_at = self.metrics.num_rounds

    def num_branches(self, s: Step) -> int:
        """Draft branches for a planned decode step: trees where the runner verifies them and
        the lane's rows are sampled plainly (coupled, no logits processing: a grammar's or a
        penalty's row context is one path), from its newest token."""
        p = s.lane.params
        plain = not p.processes_logits and (p.is_greedy or self.config.verify_mode == "coupled")
        return self.branches if plain and s.start == s.lane.num_known - 1 else 1

    def fill(self, plan: LaneRound) -> LaneRound:
        """Ask the proposer for the planned draft slots; decode steps become verify steps."""
        wanting = [s for s in plan.decode if s.num_drafts]
        if not wanting:
            return plan
        start = self.clock()
        widths = [self.num_branches(s) for s in wanting]
        lanes, ks = [s.lane for s in wanting], [s.num_drafts for s in wanting]
        if max(widths) > 1:
            drafts = self.proposer.propose(lanes, ks, widths)
        else:
            drafts = self.proposer.propose(lanes, ks)
        width = {id(s.lane): w for s, w in zip(wanting, widths, strict=True)}
        by_lane = {id(s.lane): d for s, d in zip(wanting, drafts, strict=True)}
        decode = []
        for s in plan.decode:
            d = by_lane.get(id(s.lane))
            if d is None or not d.num_tokens:
                decode.append(s)
                continue
            if d.source is not None and self.device_drafts:  # fed to the verify on the device
                rows = d.rows[: s.num_drafts]
                n, drafts = len(rows), {"draft_rows": rows, "draft_source": d.source}
            else:
                ids = d.host_ids()[: s.num_drafts]
                lp = d.logprobs[: len(ids)] if d.logprobs is not None else None
                n, drafts = len(ids), {"draft_ids": ids, "draft_logprobs": lp}
                others = [b[: s.num_drafts] for b in d.branches if b]
                if others and width[id(s.lane)] > 1:
                    drafts["branches"] = tuple(others[: width[id(s.lane)] - 1])
            decode.append(dataclasses.replace(s, end=s.end + n, num_logits=1 + n, **drafts))
        self.metrics.drafter_seconds += self.clock() - start
        return dataclasses.replace(plan, decode=tuple(decode))

    def propose_alone(self, steps: list[Step]) -> None:
        """Drafts for these steps' lanes, discarded: raises where proposing breaks."""
        self.proposer.propose([s.lane for s in steps], [s.num_drafts for s in steps])

    def prefill(self, steps: list[Step]) -> None:
        """The drafter computes the same prompt chunks, in the same round; except where drafting
        could not pay at any acceptance by the measured costs, or where device rounds predict a
        loss at the running lanes (which then draft in neither kind of round): then it catches
        up on them when it next drafts, and not at all for a request that never does."""
        if self.proposer is None or self.skips_prompts():
            return
        steps = [s for s in steps if self.drafting(s.lane)]
        if steps:
            start = self.clock()
            self.proposer.prefill([Chunk(s.lane, s.start, s.end) for s in steps])
            self.metrics.drafter_seconds += self.clock() - start

    def skips_prompts(self, num_lanes: int | None = None) -> bool:
        """Whether the drafter leaves prompt chunks to a later catch-up now (`prefill`), at the
        running lanes or at num_lanes of them."""
        costs, k = self.costs, self.config.num_draft_tokens
        if self.lazy_prefill and self.cost_aware and costs.measured and not costs.could_pay(k, 1):
            return True
        return self.device_skips_prefill(num_lanes)  # only with cost-aware drafts

    def observe(self, s: Step, hidden: torch.Tensor | None, end: int | None = None) -> None:
        """Hand an EAGLE-style drafter the target's features of the step's settled positions
        (up to `end`; by default the lane's computed ones)."""
        if hidden is None:
            return
        end = s.lane.num_computed if end is None else end
        if end > s.start and self.drafting(s.lane):
            n = end - s.start
            self.proposer.observe(s.lane, s.start, hidden if hidden.shape[0] == n else hidden[:n])

    def accepted(self, lane: Lane) -> None:
        if self.proposer is not None:
            self.proposer.accepted(lane)

    def record_verify(self, lane: Lane, num_drafts: int, num_accepted: int) -> None:
        """The lane's verify step counted, and the engine's running acceptance moved."""
        record_verify(lane, num_drafts, num_accepted)
        if num_drafts:
            kept = num_accepted / num_drafts
            self.acceptance_prior += _PRIOR_EMA * (kept - self.acceptance_prior)


def choose_num_drafts(acceptance: float, max_drafts: int) -> int:
    """Adaptive k: the largest k <= max_drafts whose k-th draft is kept with probability
    >= _MIN_USE under a lane's running per-token acceptance a (kept with a**k). At least 1."""
    k = 1
    while k < max_drafts and acceptance ** (k + 1) >= _MIN_USE:
        k += 1
    return k


def record_verify(lane: Lane, num_drafts: int, num_accepted: int) -> None:
    lane.num_drafted += num_drafts
    lane.num_accepted += num_accepted
    lane.num_verify_steps += 1
    lane.drafts_ahead = num_accepted  # the step's first kept tokens are its accepted drafts
    add_counts(lane.drafted_at, [1] * num_drafts)  # positions 0..k-1 were drafted
    add_counts(lane.accepted_at, [1] * num_accepted)
    if num_drafts:
        lane.acceptance_ema = (1 - _EMA) * lane.acceptance_ema + _EMA * num_accepted / num_drafts
