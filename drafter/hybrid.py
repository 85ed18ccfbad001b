"""Prompt lookup first, the EAGLE-style head elsewhere: one proposer made of both.

Where the text repeats itself (a long suffix of the lane occurred before), the n-gram drafter's
continuation is usually right and costs no forward; elsewhere the trained head drafts. The head
still sees every target feature (`observe`, `prefill`), so after a run of n-gram rounds it
catches up on the rows it skipped in its next forward, as after any accepted drafts.
"""

from __future__ import annotations

from collections.abc import Sequence

from lanes.drafter.base import Draft, Proposer
from lanes.drafter.eagle import EagleDrafter
from lanes.drafter.ngram import NgramProposer
from lanes.lane_view import Chunk, LaneView


class HybridProposer(Proposer):
    name = "eagle+ngram"
    uses_target_hidden = True

    def __init__(self, head: EagleDrafter, lookup: NgramProposer) -> None:
        self.head = head
        self.lookup = lookup
        self.target_feature_layers = head.target_feature_layers
        self.target_features_prenorm = head.target_features_prenorm
        # every drafting lane, every round: the head's own method, not one more call through
        self.observe = head.observe

    def prefill(self, chunks: Sequence[Chunk]) -> None:
        self.head.prefill(chunks)

    def propose(
        self,
        lanes: Sequence[LaneView],
        num_drafts: Sequence[int],
        num_branches: Sequence[int] | None = None,
    ) -> list[Draft]:
        found = self.lookup.propose(lanes, num_drafts)
        rest = [i for i, d in enumerate(found) if not d.num_tokens]
        if rest:
            args = [[lanes[i] for i in rest], [num_drafts[i] for i in rest]]
            if num_branches is not None:
                args.append([num_branches[i] for i in rest])
            drafted = self.head.propose(*args)
            for i, d in zip(rest, drafted, strict=True):
                found[i] = d
        return found

    def device_rounds(self, target, num_drafts: int, eager: bool = False, branches: int = 1):
        """Rounds on the device draft with the head alone (prompt lookup needs the host)."""
        return self.head.device_rounds(target, num_drafts, eager, branches)

    def accepted(self, lane: LaneView) -> None:
        self.head.accepted(lane)

    def release(self, lane: LaneView) -> None:
        self.head.release(lane)

    def check_integrity(self) -> None:
        self.head.check_integrity()
