"""Whether drafting pays: the measured costs of decode rounds, and the draft length that gives a
lane the most tokens per second for its measured acceptance (k = 0: do not draft).

A decode round with B lanes, D draft tokens verified in all and K drafter steps costs

    seconds = forward + per_draft * D + per_draft_step * K

forward: a round that verifies no drafts (as the engine runs it: overlapped on the GPU where it
can be); per_draft: what each verified draft adds to the target's forward; per_draft_step: the
drafter's time per step (one step serves every lane). If every lane drafts k tokens, each kept
with probability a (the lane's running acceptance), the round yields B (1 - a^(k+1)) / (1 - a)
tokens, so

    rate(k) = B (1 + a + ... + a^k) / (forward + per_draft B k + per_draft_step k)

and the engine drafts the k <= max_k with the best rate, none when rate(0) is best: drafting
never makes a lane slower than the measured costs say it would. The costs are running averages
of decode-only rounds, except `forward`: the median of the last PLAIN_WINDOW plain rounds, so
that a few slow ones (rounds that waited on other work launched before them, say) do not set
the price of every plain round after them. Until a plain and a drafted round have both been
measured, k follows the acceptance alone (speculation.choose_num_drafts). A lane that stopped
drafting drafts one token every PROBE_EVERY rounds, and every PLAIN_EVERY-th round drafts
nothing, so acceptance and the plain cost stay measured as they drift. Where drafting would not
pay even if every draft were kept (`could_pay` false), the drafter may skip prompt chunks
(lanes/drafting.py).
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

_EMA = 0.2  # weight of the newest round
PROBE_EVERY = 16  # rounds between one-token probes of a lane that does not draft
# ... where drafts are seldom kept (the engine's running acceptance below PROBE_KEEN): a probe
# there mostly confirms that drafting does not pay, and its head catch-up and verify rows cost
# ~7% of a 4-lane CPU run at every 16th round; where drafts are mostly kept, probes stay
# frequent, so that one bad cost measurement cannot stop a good drafter for long
PROBE_EVERY_SELDOM = 64
PROBE_KEEN = 0.6
PLAIN_EVERY = 64  # rounds between rounds that draft nothing (they measure `forward`)
MARGIN = 1.05  # drafting must promise this much more than not drafting
# plain rounds whose median is `forward`. On an H100 at 16 lanes a running average read 1.9-2.1
# ms for a plain round the rounds' own records put at 1.0-1.3 ms; device rounds at 2.6 ms and
# 1.5 tokens per lane then looked like a win and ran at 0.46-0.67x of no drafter. A median
# of 9 outlasts 4 such rounds and still follows a real change within 5.
PLAIN_WINDOW = 9


def _ema(old: float | None, new: float) -> float:
    return new if old is None else (1 - _EMA) * old + _EMA * new


@dataclass
class DraftCosts:
    forward: float | None = None  # seconds of a decode round without drafts
    per_draft: float | None = None  # seconds each verified draft token adds
    per_draft_step: float | None = None  # seconds per drafter step
    plain_seconds: deque = field(default_factory=lambda: deque(maxlen=PLAIN_WINDOW), repr=False)
    # (max_k, lanes, the costs) -> the highest acceptance seen whose best k was 0: best_k is
    # asked of every drafting lane every round, and a lower acceptance cannot make a draft pay
    # (each rate(k) grows with a), so those lanes skip the loop (cleared as the costs move)
    _pays_not_up_to: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def record(
        self, num_drafts: int, draft_steps: int, forward_seconds: float, drafter_seconds: float
    ) -> None:
        """One decode-only round: draft tokens verified, drafter steps run, the time of the
        target's forward and sampling, and the drafter's time."""
        self._pays_not_up_to.clear()
        if num_drafts == 0:
            self.plain_seconds.append(forward_seconds)
            self.forward = statistics.median(self.plain_seconds)
            return
        if draft_steps:
            self.per_draft_step = _ema(self.per_draft_step, drafter_seconds / draft_steps)
        if self.forward is not None:
            extra = max(0.0, forward_seconds - self.forward) / num_drafts
            self.per_draft = _ema(self.per_draft, extra)

    @property
    def measured(self) -> bool:
        return self.forward is not None and self.per_draft_step is not None

    def could_pay(self, max_k: int, num_lanes: int) -> bool:
        """Whether some k would pay were every draft kept."""
        return self.best_k(1.0, max_k, num_lanes) > 0

    def best_k(self, acceptance: float, max_k: int, num_lanes: int) -> int:
        """The draft length with the most tokens per second (0: not drafting pays best)."""
        assert self.forward is not None and self.per_draft_step is not None
        key = (max_k, num_lanes, self.forward, self.per_draft, self.per_draft_step)
        if acceptance <= self._pays_not_up_to.get(key, -1.0):
            return 0
        best_k, best_rate = 0, num_lanes / self.forward * MARGIN
        tokens = float(num_lanes)
        for k in range(1, max_k + 1):
            tokens += num_lanes * acceptance**k
            cost = self.forward + ((self.per_draft or 0.0) * num_lanes + self.per_draft_step) * k
            if tokens / cost > best_rate:
                best_k, best_rate = k, tokens / cost
        if best_k == 0:
            self._pays_not_up_to[key] = max(acceptance, self._pays_not_up_to.get(key, -1.0))
        return best_k


DEVICE_SAMPLES = 8  # device rounds measured before they are judged
# rounds without device rounds after they did not pay (same requests): on the H200 at 16 lanes
# every restart cost a catch-up round of the head (7-30 ms) and 8+ losing rounds (64 let that
# repeat within a request)
DEVICE_PAUSE = 512
DEVICE_MEASURE = 4  # plain rounds run to measure one (no plain round measured, or long ago)
DEVICE_STALE = 512  # rounds after which a plain round's measured time is measured again
# device rounds do not start where the lanes' acceptance predicts a loss by this much: a start
# is judged by rounds that may lose, so only a clear loss skips it
DEVICE_CLEAR = 1.1
# rounds after which they start again (measured) whatever the prediction: each retry costs a
# catch-up of the head's skipped rows and 8 rounds judged. Every pause at a lane count doubles
# its interval, up to DEVICE_RETRY_MAX: on an H100 at 64 lanes a retry's catch-up took 1.04 s
# of a 1.5 s pass (0.56x of no drafter), more than 4,096 rounds of ~1.1 ms can win back
DEVICE_RETRY = 4096
DEVICE_RETRY_MAX = 2**17


@dataclass
class DeviceRoundCosts:
    """Whether drafted rounds on the device (lanes/device_rounds.py) pay: they draft a fixed k,
    so they are judged as a whole, against a plain round's measured time (DraftCosts.forward):
    a plain round gives each lane one token; a device round gives it `tokens` (mean since they
    started) in `seconds`. They pause once tokens * forward < seconds (a plain round is faster by
    their measured means; with a margin of 1.1 they went on at 4 lanes losing 5%).

    A device round's seconds by lane count are kept across starts (`round_seconds`): before
    they start, the lanes' acceptance predicts their tokens (`predicts_loss`), so that new
    requests at a lane count where they lose are not judged afresh by losing rounds."""

    samples: int = 0  # device rounds measured since they last started
    total_tokens: float = 0.0  # their tokens per lane, summed
    total_seconds: float = 0.0
    round_seconds: dict[int, float] = field(
        default_factory=dict
    )  # by lane count, weighted to the newest

    retry_rounds: dict[int, int] = field(default_factory=dict)  # by lane count

    def retry_every(self, num_lanes: int) -> int:
        """Rounds after a start at which they start again at this lane count, whatever the
        prediction."""
        return self.retry_rounds.get(num_lanes, DEVICE_RETRY)

    def paused_at(self, num_lanes: int) -> None:
        """They did not pay at this lane count: retry it half as often."""
        self.retry_rounds[num_lanes] = min(DEVICE_RETRY_MAX, 2 * self.retry_every(num_lanes))

    def record(self, tokens_per_lane: float, seconds: float, num_lanes: int = 0) -> None:
        self.total_tokens += tokens_per_lane
        self.total_seconds += seconds
        self.samples += 1
        if num_lanes:
            self.round_seconds[num_lanes] = _ema(self.round_seconds.get(num_lanes), seconds)

    def restart(self) -> None:
        """Judge afresh (the rounds stopped; their requests may change)."""
        self.samples, self.total_tokens, self.total_seconds = 0, 0.0, 0.0

    # means since they started: a few rejected rounds in a row must not pause a request whose
    # drafts pay on the whole (a running average over few rounds did, on everyday prompts)
    @property
    def tokens(self) -> float:
        return self.total_tokens / max(1, self.samples)

    @property
    def seconds(self) -> float:
        return self.total_seconds / max(1, self.samples)

    def verdict(self, forward: float | None, stale: bool = False) -> str:
        """ "go" (not judged yet, or they pay), "measure" (no plain round measured, or `stale`:
        run some) or "pause" (a plain round is faster)."""
        if self.samples < DEVICE_SAMPLES:
            return "go"
        if forward is None or stale:
            return "measure"
        return "go" if self.tokens * forward >= self.seconds else "pause"

    def predicts_loss(
        self, num_lanes: int, acceptance: float, k: int, forward: float | None
    ) -> bool:
        """Whether device rounds of k drafts over num_lanes lanes, each draft kept with chance
        `acceptance` (the lanes' running share of drafts kept), would clearly lose to plain
        rounds by the measured times; False where either time is not measured."""
        seconds = self.round_seconds.get(num_lanes)
        if seconds is None or forward is None:
            return False
        return (1 + k * acceptance) * forward * DEVICE_CLEAR < seconds
