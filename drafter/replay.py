"""The replay drafter, for benchmarks: proposes a recorded continuation, each token right with a
set probability, so speculative speedup can be measured at a controlled acceptance on random
weights (where no real drafter agrees with the target)."""

from __future__ import annotations

from collections.abc import Sequence

from lanes.drafter.base import Draft, Proposer
from lanes.lane_view import LaneView
from lanes.sampling import uniform_at

_STREAM_REPLAY = 3


class ReplayProposer(Proposer):
    name = "replay"

    def __init__(
        self, recordings: dict[tuple[int, ...], list[int]], acceptance: float, vocab_size: int
    ):
        """recordings: prompt token ids -> the target's own (undrafted) output for that prompt."""
        if not 0.0 <= acceptance <= 1.0:
            raise ValueError(f"acceptance must be in [0, 1], got {acceptance}")
        self.recordings = recordings
        self.acceptance = acceptance
        self.vocab_size = vocab_size

    def propose(
        self,
        lanes: Sequence[LaneView],
        num_drafts: Sequence[int],
        num_branches: Sequence[int] | None = None,
    ) -> list[Draft]:
        """Each branch b (the lane's own drafts: b = 0) is right at each token with the set
        probability, by noise of its own: a branch may go on where another went wrong."""
        num_branches = num_branches or [1] * len(lanes)
        drafts = []
        for lane, k, w in zip(lanes, num_drafts, num_branches, strict=True):
            record = self.recordings.get(tuple(lane.prompt_ids), [])
            first = lane.num_known - len(lane.prompt_ids)  # index of the next output token
            paths = []
            for b in range(w):
                tokens = []
                for j in range(min(k, len(record) - first)):
                    right = record[first + j]
                    # A pure function of (seed, position): the same drafts whatever the batch.
                    u = uniform_at(lane.params.seed, lane.num_known + j, _STREAM_REPLAY, b)
                    wrong = (right + 1 + b) % self.vocab_size
                    tokens.append(right if u < self.acceptance else wrong)
                if tokens and tuple(tokens) not in paths:
                    paths.append(tuple(tokens))
            own = paths[0] if paths else ()
            drafts.append(Draft(own, branches=tuple(paths[1:])))
        return drafts
