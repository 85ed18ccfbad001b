"""Lane rounds: the plan of one forward, and the rule that makes it.

The rule: each lane's computed tokens catch up with its known tokens. A lane in FILL has prompt
tokens to compute (in chunks, as the round's token budget allows); a lane in DECODE has exactly
one (its newest token). A lane that has caught up after the round gets a sampled token.
"""

from __future__ import annotations

from dataclasses import dataclass

from lanes.lane import Lane, LaneState


@dataclass(frozen=True)
class Step:
    lane: Lane
    start: int  # first position computed in this round
    end: int  # one past the last

    @property
    def samples(self) -> bool:
        """Whether this step's last row yields the lane's next token."""
        return self.end == self.lane.num_known


@dataclass(frozen=True)
class LaneRound:
    steps: tuple[Step, ...]

    @property
    def num_tokens(self) -> int:
        return sum(s.end - s.start for s in self.steps)


def plan_round(running: list[Lane], max_tokens: int) -> LaneRound:
    """Decode lanes first (one token each), then prompt chunks in arrival order within budget."""
    steps: list[Step] = []
    budget = max_tokens
    decoding = [lane for lane in running if lane.state is LaneState.DECODE]
    filling = [lane for lane in running if lane.state is LaneState.FILL]
    for lane in decoding:
        if budget == 0:
            break
        steps.append(Step(lane, lane.num_computed, lane.num_known))
        budget -= lane.num_known - lane.num_computed
    for lane in filling:
        if budget == 0:
            break
        end = min(lane.num_known, lane.num_computed + budget)
        steps.append(Step(lane, lane.num_computed, end))
        budget -= end - lane.num_computed
    return LaneRound(tuple(steps))
