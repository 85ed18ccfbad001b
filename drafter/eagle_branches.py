"""Draft trees from an EAGLE-style head: several chains per lane, each led by one of the head's
best first tokens.

Most chains go wrong at their first draft, where the head is least sure and any miss ends the
round's gain; so the branches fork at the root: branch b starts with the head's b-th likeliest
first token (`lanes.sampling.ranked_tokens`: the perturbed scores of the lane's own sampling, so
branch 0 is the chain the head would draft alone) and goes on as a chain, every branch one more
row of the same head forwards. Branch rows past the fork keep the head's KV in the head runner's
branch scratch (lanes/branch_scratch.py); rows fed with drafts are rewritten by the next catch-up,
so nothing is kept of them.

    catch-up rows ... (t41, f40) -> ranked first drafts a, b, c
    branch 0: (a, g41) -> a2 -> a3     branch 1: (b, g41) -> b2 -> b3     branch 2: (c, g41) ...
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lanes.drafter.base import Draft
from lanes.lane_rows import rows_of
from lanes.lane_view import LaneView
from lanes.sampling import ranked_tokens, sample_row


def propose_branches(
    head,  # lanes.drafter.eagle.EagleDrafter (not imported: it imports this module)
    lanes: Sequence[LaneView],
    num_drafts: Sequence[int],
    num_branches: Sequence[int],
) -> list[Draft]:
    """Up to num_drafts[i] drafts on each of up to num_branches[i] branches of lane i, sampled
    on the host (the branch rows run eagerly)."""
    paths: dict[int, list[list[int]]] = {lane.request_id: [] for lane in lanes}
    steps = []  # (shadow, branch, rows)
    wanted = {}
    for lane, k in zip(lanes, num_drafts, strict=True):
        shadow = head._shadow(lane)
        if k > 0 and head._reserve(shadow, shadow.num_known + k - 1):
            wanted[lane.request_id] = k
            end = shadow.num_known
            feats = shadow.features_until(end, head._zero)
            n = head.runner.catch_up_logits(end - shadow.num_computed)  # fits a graph bucket
            rows = rows_of(shadow, shadow.num_computed, end, num_logits=n, features=feats)
            steps.append((shadow, 0, rows))
    width = {lane.request_id: w for lane, w in zip(lanes, num_branches, strict=True)}
    j = 0
    while steps:
        rows = [r for _, _, r in steps]
        logits = head._full_logits(head.runner.execute(rows))
        hidden = head.runner.last_hidden
        ends = torch.tensor([r.num_tokens for r in rows]).cumsum(0) - 1
        guesses = hidden[ends.to(hidden.device)]  # each row's guess of the next feature
        last = torch.tensor([r.num_logits for r in rows]).cumsum(0) - 1
        logits = logits[last.to(logits.device)]  # each step's last logits row
        next_steps = []
        for i, (shadow, branch, r) in enumerate(steps):
            lane = shadow.lane
            request, position = lane.request_id, lane.num_known + j
            if j == 0:  # the catch-up: its rows are settled, and the branches start here
                shadow.advance(r.end)
                head._publish(shadow)
                firsts = ranked_tokens(logits[i], lane.params, position, width[request])
                paths[request] = [[t] for t in firsts]
                tokens = list(enumerate(firsts))
            else:
                token = sample_row(logits[i], lane.params, position, lane.params.seed)[0]
                paths[request][branch].append(token)
                tokens = [(branch, token)]
            if j + 1 >= wanted[request]:
                continue
            row = shadow.num_known + j  # the head's row reading this draft
            fork = shadow.num_known
            for b, token in tokens:
                nxt = rows_of(
                    shadow, row, row + 1, num_logits=1, features=guesses[i : i + 1],
                    draft_ids=(token,), branch=b, fork=fork if b else 0,
                )  # fmt: skip
                next_steps.append((shadow, b, nxt))
        steps = next_steps
        j += 1
    return [
        Draft(tuple(p[0]), branches=tuple(tuple(b) for b in p[1:])) if p else Draft()
        for p in (paths[lane.request_id] for lane in lanes)
    ]
