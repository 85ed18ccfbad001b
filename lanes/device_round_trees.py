"""Draft trees in device rounds: W branches per lane (lanes/branch_scratch.py), all on the device.

A round of lane i with branches: the head's catch-up samples draft 1 of branch 0 as a chain
round does, and its `alternatives` lead branches 1 .. W-1; the head's later forwards run every
branch as a row of its own, and the verify forward every branch as T = k + 1 rows from the
root, as a lane of its own. A branch row reads the lane's context slots before its fork and its
own scratch slots from the fork on, so its bits are those of undrafted decoding after the same
tokens; the layout below rebuilds those slot rows every round from the lane rows:

    tree row (i, b)   = lane row i, then entries fork .. fork + n of branch b > 0 replaced by
                        its scratch slots     (head: fork v + a + 1, n = k - 1; target: fork v')

Acceptance is `walk_branches` on the device: a branch keeps its leading drafts equal to its own
samples; the round keeps the most (the lowest branch among equals) and emits that branch's
samples. Branches that agree on a prefix hold the same tokens there, so their rows have the same
bits, and the kept count is the walk's. The kept branch's K/V (rows 1 .. k; those past the kept
count are rewritten by later forwards before any reads them, as in chain rounds) is copied into
the lane's own slots; the head needs no copy, its catch-up recomputes the rows.
"""

from __future__ import annotations

import torch


class BranchLayout:
    """The tree buffers of one lane bucket (L lanes, W branches, T = k + 1)."""

    def __init__(self, lanes: int, branches: int, k: int, head_ctx: int, target_ctx: int, device):
        self.lanes, self.w, self.k, self.t = lanes, branches, k, k + 1
        i64 = dict(dtype=torch.int64, device=device)
        n = lanes * branches
        self.head_ctx, self.target_ctx = head_ctx, target_ctx
        self.head_kv = torch.zeros(n * head_ctx, **i64)  # tree rows' context slots
        self.target_kv = torch.zeros(n * target_ctx, **i64)
        # scratch slots by (lane, branch, offset), set when lanes start (branch 0: unused)
        self.head_scratch = torch.zeros((lanes, branches, max(1, k - 1)), **i64)
        self.target_scratch = torch.zeros((lanes, branches, k + 1), **i64)
        self.is_branch = (torch.arange(branches, **i64) > 0).view(1, branches, 1)
        # the head's draft forwards m = 1 .. k-1 and the verify: positions, slots, meta
        self.draft_pos = torch.zeros((max(1, k - 1), n), **i64)
        self.draft_slots = torch.zeros((max(1, k - 1), n), **i64)
        self.draft_meta = torch.ones((max(1, k - 1), 2, n), dtype=torch.int32, device=device)
        self.verify_pos = torch.zeros(n * self.t, **i64)
        self.verify_slots = torch.zeros(n * self.t, **i64)
        self.verify_meta = torch.ones((2, n), dtype=torch.int32, device=device)
        rows = torch.arange(n, **i64).view(lanes, branches, 1)
        self.head_base = rows * head_ctx  # [L, W, 1]: each tree row's first kv_slots entry
        self.target_base = rows * target_ctx
        self.head_offsets = torch.arange(max(1, k - 1), **i64).view(1, 1, -1)
        self.target_offsets = torch.arange(k + 1, **i64).view(1, 1, -1)

    def set_scratch(self, row: int, head: list[list[int]], target: list[list[int]]) -> None:
        """Lane row `row`'s scratch slots, per branch 1 .. W-1: the head's [k - 1] and the
        target's [k + 1] (host lists, copied now: rounds start between graph replays)."""
        device = self.head_scratch.device
        if self.k > 1:
            self.head_scratch[row, 1:] = torch.tensor(head, dtype=torch.int64).to(device)
        self.target_scratch[row, 1:] = torch.tensor(target, dtype=torch.int64).to(device)

    def pad(self, row: int, head_slot: int, target_slot: int) -> None:
        """A padding lane row's branches write to the sides' padding slots."""
        self.head_scratch[row].fill_(head_slot)
        self.target_scratch[row].fill_(target_slot)

    def layout(self, lane_head_kv, lane_target_kv, draft_values, draft_slots, draft_meta,
               verify_values, verify_slots, verify_meta, fork) -> None:  # fmt: skip
        """The tree rows from the lane rows' layout: draft_values/draft_slots [k-1, L] and
        draft_meta [k-1, 2, L] of the head's forwards, verify_values/verify_slots [L, T] and
        verify_meta [2, L] of the verify, fork [L] (the verify's first position, v + a + 1)."""
        w, lanes = self.w, self.lanes
        self.head_kv.view(lanes, w, -1).copy_(lane_head_kv.view(lanes, 1, -1).expand(-1, w, -1))
        self.target_kv.view(lanes, w, -1).copy_(lane_target_kv.view(lanes, 1, -1).expand(-1, w, -1))
        at = fork.view(lanes, 1, 1)
        target_at = (self.target_base + at + self.target_offsets)[:, 1:]
        self.target_kv.index_copy_(0, target_at.reshape(-1), self.target_scratch[:, 1:].reshape(-1))
        if self.k > 1:
            head_at = (self.head_base + at + self.head_offsets)[:, 1:]
            self.head_kv.index_copy_(0, head_at.reshape(-1), self.head_scratch[:, 1:].reshape(-1))
            m = self.k - 1
            self.draft_pos.copy_(draft_values.repeat_interleave(w, dim=1))
            own = draft_slots.view(m, lanes, 1).expand(-1, -1, w)
            scratch = self.head_scratch.permute(2, 0, 1)[:m]  # [k-1, L, W]: offset m - 1
            branch = self.is_branch.view(1, 1, w)
            self.draft_slots.view(m, lanes, w).copy_(torch.where(branch, scratch, own))
            self.draft_meta.copy_(draft_meta.repeat_interleave(w, dim=2))
        t = self.t
        self.verify_pos.view(lanes, w, t).copy_(verify_values.view(lanes, 1, t).expand(-1, w, -1))
        own = verify_slots.view(lanes, 1, t).expand(-1, w, -1)
        self.verify_slots.view(lanes, w, t).copy_(
            torch.where(self.is_branch, self.target_scratch, own)
        )
        self.verify_meta.copy_(verify_meta.repeat_interleave(w, dim=1))

    def choose(self, drafts: torch.Tensor, tokens: torch.Tensor):
        """drafts [L, W, k], tokens [L, W, T] (each branch's samples): (kept drafts [L], the
        branch kept [L]): the most leading drafts equal to their branch's samples, the lowest
        branch among equals."""
        w = self.w
        kept = (tokens[:, :, : self.k] == drafts).long().cumprod(2).sum(2)  # [L, W]
        order = torch.arange(w - 1, -1, -1, device=kept.device)
        branch = (kept * w + order).argmax(1)  # unique keys: the most, then the lowest branch
        return kept.gather(1, branch[:, None])[:, 0], branch

    def adopt(self, kv, branch: torch.Tensor, verify_slots: torch.Tensor) -> None:
        """The kept branch's K/V rows 1 .. k into the lane's own slots (branch 0: in place).
        verify_slots [L, T]: the lane's own slots of the verify rows."""
        own = verify_slots[:, 1:]
        scratch = self.target_scratch.gather(1, branch.view(-1, 1, 1).expand(-1, 1, self.t))[
            :, 0, 1:
        ]
        source = torch.where((branch > 0)[:, None], scratch, own).reshape(-1)
        own = own.reshape(-1)
        for cache in (kv.k, kv.v):
            cache[:, own] = cache[:, source]
