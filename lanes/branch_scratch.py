"""Branch scratch: KV slots, outside the block pool, where a lane's extra draft branches live.

A drafted round may verify several branches of one lane (a draft tree as root-to-leaf paths):
branch 0 is the lane's own rows, in its blocks; branch b > 0 repeats the lane's newest token
(the root) and carries its own drafts. Its rows read the lane's KV before the fork and their own
KV from the fork on, so every branch has the layout of undrafted decoding — a row's bits are
those decode gives its position after the same tokens, whatever its siblings hold. The slots of
(lane slot s, branch b, position fork + i) are fixed:

    base + ((s * (branches - 1) + b - 1) * depth + i)

so nothing is allocated per round. When the target accepts a path on branch b > 0, its KV rows
are copied into the lane's own slots (`ModelRunner.adopt_branch`); the rest is dropped by being
overwritten next round.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BranchScratch:
    base: int  # the first scratch slot of the KV pool
    num_lanes: int  # lane slots (block-table rows) that may branch
    branches: int  # branches per lane, branch 0 included
    depth: int  # positions per branch, from its fork

    @staticmethod
    def num_slots(num_lanes: int, branches: int, depth: int) -> int:
        return num_lanes * max(0, branches - 1) * depth

    def slots(self, lane_slot: int, branch: int, offsets: range) -> list[int]:
        """Scratch slots of positions fork + offsets on this lane's branch."""
        if not 0 < branch < self.branches or not 0 <= lane_slot < self.num_lanes:
            raise IndexError(f"no scratch for branch {branch} of lane slot {lane_slot}")
        if offsets and (offsets.start < 0 or offsets.stop > self.depth):
            raise IndexError(f"branch rows {offsets} past the scratch depth {self.depth}")
        first = self.base + (lane_slot * (self.branches - 1) + branch - 1) * self.depth
        return [first + i for i in offsets]
