"""Lane rounds: the plan of one round, and the one rule that makes it.

The rule: each lane's computed tokens catch up with its known tokens (prompt + accepted output).
A DECODE lane has one token to compute, its newest; a FILL lane has prompt tokens (or, after a
preemption, prompt and output tokens), computed in chunks as the round's prefill budget allows.
A step that catches its lane up samples the lane's next token. Prefix-cache hits, chunking,
preemption and cancellation all only move `num_computed`; none is a separate path.
"""

from __future__ import annotations

from dataclasses import dataclass

from lanes.lane import Lane, LaneState


@dataclass(frozen=True)
class Step:
    lane: Lane
    start: int  # first position computed
    end: int  # one past the last
    samples: bool  # end reaches the lane's known tokens: its last row yields the next token

    @property
    def num_tokens(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class LaneRound:
    """An immutable plan: decode steps and prefill steps, run as host-managed forwards.

    `forwards()` groups the steps: the first forward carries every decode step and the first
    prefill chunk; each further forward carries the next chunk. Between forwards the engine can
    cancel lanes, so a cancellation never waits for the whole round.
    """

    decode: tuple[Step, ...]
    prefill: tuple[Step, ...]
    chunk_tokens: int

    @property
    def num_decode_tokens(self) -> int:
        return sum(s.num_tokens for s in self.decode)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(s.num_tokens for s in self.prefill)

    @property
    def steps(self) -> tuple[Step, ...]:
        return self.decode + self.prefill

    def forwards(self) -> list[tuple[Step, ...]]:
        groups: list[list[Step]] = [list(self.decode)]
        filled = 0
        for step in self.prefill:
            if filled and filled + step.num_tokens > self.chunk_tokens:
                groups.append([])
                filled = 0
            groups[-1].append(step)
            filled += step.num_tokens
        return [tuple(g) for g in groups if g]


def plan_round(
    running: list[Lane], prefill_budget: int, chunk_tokens: int, block_size: int
) -> LaneRound:
    """Every DECODE lane gets its step; FILL lanes, in admission order, get steps of at most
    `chunk_tokens` until `prefill_budget` is spent. A step ends on a block boundary unless it
    reaches the lane's known tokens, so a cancelled prefill keeps whole blocks.

    Example, block_size 16, chunk 64, budget 100, a lane at num_computed 40 of 300 known:
    steps [40, 96) and [96, 128); 88 tokens (ending at 140) would not end on a boundary.
    """
    decode = tuple(
        Step(lane, lane.num_computed, lane.num_known, samples=True)
        for lane in running
        if lane.state is LaneState.DECODE
    )
    prefill: list[Step] = []
    budget = prefill_budget
    for lane in running:
        if lane.state is not LaneState.FILL:
            continue
        pos = lane.num_computed
        while budget > 0 and pos < lane.num_known:
            end = min(lane.num_known, pos + min(budget, chunk_tokens))
            if end < lane.num_known:
                end -= end % block_size
            if end <= pos:
                break
            prefill.append(Step(lane, pos, end, samples=end == lane.num_known))
            budget -= end - pos
            pos = end
        if budget <= 0:
            break
    return LaneRound(decode, tuple(prefill), chunk_tokens)
