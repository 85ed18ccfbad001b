"""A budget of grammar-mask time per lane, so one structured-output request with a costly grammar
cannot slow every other lane down.

A grammar's masks are computed on the host, on the engine thread, row by row; their cost depends
on the grammar (a 100,000-character `guided_choice` string: ~26 ms a mask on the dev box, against
a ~20 ms round of the default model). Every lane in a round waits for them. So each lane pays for
its masks in rounds: its mask seconds are a debt, repaid at `share` of each round's other work
(the round's wall time less the masks); while a lane owes and another lane can run, it rests —
it is left out of the round's plan, keeping its KV and its place. Lanes then spend at most about
`share` of the engine's time on masks beyond what the rounds themselves take, and the others'
rounds stretch by at most about 1 + share on average. A lane alone never rests: there is no one
to wait for it. Cheap grammars (a mask well under a round's share) never owe past one round.

Resting changes when a lane's tokens come, never which tokens: a lane's tokens depend only on its
own prefix (concurrent == solo holds with any batch composition).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

DEFAULT_SHARE = 0.25


class Metered(Protocol):
    """What the budget reads of a lane: its id and the engine-thread seconds its grammar's
    masks have cost so far (computing them, or waiting for them: lanes/mask_prefetch.py)."""

    request_id: int

    @property
    def mask_seconds(self) -> float: ...


L = TypeVar("L", bound=Metered)


class MaskBudget:
    def __init__(self, share: float = DEFAULT_SHARE) -> None:
        if share <= 0:
            raise ValueError(f"the mask share must be positive, got {share}")
        self.share = share
        self._debt: dict[int, float] = {}  # request id -> seconds owed (> 0 only)
        self._seen: dict[int, float] = {}  # request id -> mask seconds already charged
        self.num_rests = 0  # lane-rounds left out, for metrics and tests

    def runnable(self, lanes: Sequence[L]) -> list[L]:
        """The lanes to plan this round: all but those that owe mask time, unless every lane
        owes (then none waits for another)."""
        owing = {lane.request_id for lane in lanes if lane.request_id in self._debt}
        if not owing or len(owing) == len(lanes):
            return list(lanes)
        self.num_rests += len(owing)
        return [lane for lane in lanes if lane.request_id not in owing]

    def end_round(self, lanes: Sequence[Metered], round_seconds: float) -> None:
        """After a round: charge each lane the mask seconds it spent since the last round, and
        credit every lane that owes with share × the round's work besides masks."""
        spent = {}
        for lane in lanes:
            total = lane.mask_seconds
            if total:  # lanes without a grammar never owe: nothing to keep for them
                spent[lane.request_id] = total - self._seen.get(lane.request_id, 0.0)
                self._seen[lane.request_id] = total
        other_work = max(0.0, round_seconds - sum(spent.values()))
        for rid, seconds in spent.items():
            owed = self._debt.get(rid, 0.0) + seconds - self.share * other_work
            if owed > 0:
                self._debt[rid] = owed
            else:  # no credit is banked for later
                self._debt.pop(rid, None)

    def forget(self, request_id: int) -> None:
        """A lane that ended."""
        self._debt.pop(request_id, None)
        self._seen.pop(request_id, None)
