"""The n-gram drafter (prompt lookup): continue the text the way it continued before."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from lanes.drafter.base import Draft, Proposer
from lanes.lane_view import LaneView


def ngram_continuation(tokens: np.ndarray, k: int, min_n: int, max_n: int) -> tuple[int, ...]:
    """Up to k tokens that followed the latest earlier occurrence of the longest suffix n-gram.

    Example, tokens = [5 6 7 9 5 6 7], max_n 3: the suffix (5 6 7) occurred at 0, followed by
    9 5 6 ..., so k = 2 gives (9, 5). Longer n-grams are tried first; earlier occurrences are
    searched in tokens[:-1] so that each has at least one following token.
    """
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        windows = sliding_window_view(tokens[:-1], n)  # windows[i] = tokens[i : i + n]
        hits = np.flatnonzero((windows == tokens[-n:]).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return tuple(int(t) for t in tokens[start : start + k])
    return ()


class NgramProposer(Proposer):
    name = "ngram"

    def __init__(self, min_n: int = 2, max_n: int = 4) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.min_n, self.max_n = min_n, max_n

    def propose(
        self, lanes: Sequence[LaneView], num_drafts: Sequence[int], num_branches=None
    ) -> list[Draft]:
        return [
            Draft(
                ngram_continuation(np.asarray(lane.all_ids()), k, self.min_n, self.max_n)
                if k
                else ()
            )
            for lane, k in zip(lanes, num_drafts, strict=True)
        ]
