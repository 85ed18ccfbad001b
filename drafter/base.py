"""The proposer contract: what a drafter is asked, and when."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from lanes.lane import Lane
    from lanes.rounds import Step


@dataclass(frozen=True)
class Draft:
    token_ids: tuple[int, ...]
    # The drafter's sampling distribution at each drafted position [len, vocab] (log space), for
    # rejection-mode verification; None when the drafter proposes deterministically.
    logprobs: torch.Tensor | None = None


class Proposer:
    """Proposes draft tokens for decode lanes. The engine calls, in each round:

    - `prefill(steps)` after every forward, with that forward's prefill steps of drafting lanes:
      a drafter with its own KV computes the same chunks, inside the same round (its time
      counts in the round's measured time, hence in the share allocator's cost model);
    - `propose(lanes, num_drafts)` once before the round's forwards: up to num_drafts[i] tokens
      continuing lane i's known tokens (fewer, or none, is always allowed);
    - `accepted(lane)` after the lane's drafts were verified: `lane.num_computed` says how much
      of the lane is now settled; state past it must be rolled back;
    - `release(lane)` when the lane ends or is preempted: drop everything kept for it;
    - `observe(lane, start, hidden)`, only for proposers with `uses_target_hidden`, after every
      target forward over a drafting lane and before `prefill`/`accepted`: the target's
      final-norm features of positions [start, start + len(hidden)), now settled (a view the next
      forward overwrites: copy what you keep); with `target_feature_layers`, the normed outputs
      of those target layers side by side instead (lanes.models.decoder).

    A proposer only affects speed: with coupled verification the output never depends on it.
    """

    name = "proposer"
    uses_target_hidden = False
    target_feature_layers: tuple[int, ...] | None = None

    def prefill(self, steps: Sequence[Step]) -> None:
        return None

    def propose(self, lanes: Sequence[Lane], num_drafts: Sequence[int]) -> list[Draft]:
        raise NotImplementedError

    def accepted(self, lane: Lane) -> None:
        return None

    def release(self, lane: Lane) -> None:
        return None

    def observe(self, lane: Lane, start: int, hidden: torch.Tensor) -> None:
        return None
