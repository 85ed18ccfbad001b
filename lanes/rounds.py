"""Lane rounds: the plan of one round, and the one rule that makes it.

The rule: each lane's computed tokens catch up with its known tokens (prompt + accepted output).
A DECODE lane has one token to compute, its newest; a FILL lane has prompt tokens (or, after a
preemption, prompt and output tokens), computed in chunks as the round's prefill budget allows.
A step that catches its lane up samples the lane's next token. Prefix-cache hits, chunking,
preemption and cancellation all only move `num_computed`; none is a separate path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lanes.lane import Lane, LaneState
from lanes.lane_rows import LaneRows, rows_of

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Step:
    """Positions [start, end) of one lane in one forward.

    Their tokens are the lane's known tokens, then `draft_ids` (drafts under verification, which
    extend past the known ones). `num_logits` trailing rows yield next-token logits: 1 for a step
    that catches its lane up, 1 + len(draft_ids) for a verify step, 0 for a mid-prompt chunk.
    A planned decode step reserves `num_drafts` positions for drafts the engine fills in.

        known: ... t40 t41 | drafts d1 d2 d3      (lane.num_known = 42, num_computed = 41)
        verify step: start 41, end 45, tokens [t41 d1 d2 d3], num_logits 4
    """

    lane: Lane
    start: int
    end: int
    num_logits: int = 0
    draft_ids: tuple[int, ...] = ()
    num_drafts: int = 0
    draft_logprobs: torch.Tensor | None = field(default=None, compare=False, repr=False)
    # [num_tokens, hidden]: target features the rows read (EAGLE-style drafter steps only)
    features: torch.Tensor | None = field(default=None, compare=False, repr=False)
    # Overlap: the step's first token is row `pending_row` of the previous forward's samples,
    # still on the device (the lane does not know it yet); the runner copies it device to device.
    pending_row: int | None = None
    # Drafts still on the device (Draft.source): the step's last len(draft_rows) tokens are
    # those rows of `draft_source`, copied device to device; draft_ids stays empty until the
    # engine reads them back with the verify forward's samples.
    draft_rows: tuple[int, ...] = ()
    draft_source: torch.Tensor | None = field(default=None, compare=False, repr=False)
    # A draft tree's other root-to-leaf paths (lanes/branch_scratch.py): branch b (1, 2, ...)
    # repeats the step's root (its first token, the lane's newest) with drafts branches[b - 1],
    # in rows of its own after the step's; the verifier follows the target's samples through
    # them all (lanes/speculation.walk_branches).
    branches: tuple[tuple[int, ...], ...] = ()

    @property
    def num_tokens(self) -> int:
        return self.end - self.start

    @property
    def num_rows(self) -> int:
        """The step's rows in the forward: its own and its branches'."""
        if not self.branches:  # asked of every step of a drafting round: the common case first
            return self.end - self.start
        return self.num_tokens + sum(1 + len(b) for b in self.branches)

    @property
    def num_logits_rows(self) -> int:
        """The logits rows the step yields: its own and every branch row."""
        return self.num_logits + sum(1 + len(b) for b in self.branches)

    @property
    def draft_paths(self) -> tuple[tuple[int, ...], ...]:
        """The drafts of every branch, the step's own first."""
        return (self.draft_ids, *self.branches)

    @property
    def samples(self) -> bool:
        return self.num_logits > 0

    @property
    def first_sample_position(self) -> int:
        """The position the first logits row predicts (row j predicts this + j)."""
        return self.end - self.num_logits + 1

    @property
    def num_drafted(self) -> int:
        return len(self.draft_rows) if self.draft_source is not None else len(self.draft_ids)

    def rows(self) -> list[LaneRows]:
        """This step as the runner takes it: the lane named by its slot, its blocks and token
        ids as plain data (lanes/lane_rows.py); then each branch's rows, forked at the root."""
        own = rows_of(
            self.lane, self.start, self.end,
            num_logits=self.num_logits, draft_ids=self.draft_ids, pending_row=self.pending_row,
            draft_rows=self.draft_rows, draft_source=self.draft_source, features=self.features,
        )  # fmt: skip
        root = self.lane.num_known - 1
        return [own] + [
            rows_of(
                self.lane,
                root,
                root + 1 + len(drafts),
                num_logits=1 + len(drafts),
                draft_ids=drafts,
                branch=b,
                fork=root,
            )  # fmt: skip
            for b, drafts in enumerate(self.branches, 1)
        ]


def lane_rows(steps: Sequence[Step]) -> list[LaneRows]:
    return [r for s in steps for r in s.rows()]


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
        """Decode and verify tokens, counting every planned draft slot."""
        return sum(s.num_tokens + s.num_drafts for s in self.decode)

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
    running: list[Lane],
    prefill_budget: int,
    chunk_tokens: int,
    block_size: int,
    num_drafts: Callable[[Lane], int] = lambda lane: 0,
) -> LaneRound:
    """Every DECODE lane gets its step (with `num_drafts(lane)` draft slots); FILL lanes, in
    admission order, get steps of at most `chunk_tokens` until `prefill_budget` is spent. A step
    ends on a block boundary unless it reaches the lane's known tokens, so a cancelled prefill
    keeps whole blocks.

    Example, block_size 16, chunk 64, budget 100, a lane at num_computed 40 of 300 known:
    steps [40, 96) and [96, 128); 88 tokens (ending at 140) would not end on a boundary.
    """
    decode = tuple(
        Step(lane, lane.num_computed, lane.num_known, num_logits=1, num_drafts=num_drafts(lane))
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
            prefill.append(Step(lane, pos, end, num_logits=int(end == lane.num_known)))
            budget -= end - pos
            pos = end
        if budget <= 0:
            break
    return LaneRound(decode, tuple(prefill), chunk_tokens)
