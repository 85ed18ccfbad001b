"""Device rounds among other lanes and with draft trees (lanes/device_round_trees.py): a lane's
rounds in a larger bucket are its rounds alone, and three branches per lane emit exactly the
undrafted tokens and logprobs, greedy and seeded, with negative controls. Split from
tests/test_device_rounds.py, whose helpers it uses, so the two run on two workers."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from lanes.device_rounds import DeviceRounds, _Bucket
from tests.test_device_rounds import (
    DEVICE,
    PARAMS,
    PROMPTS,
    SEEDED,
    _engine,
    _plain,
    make_head_dir,
)


@pytest.fixture(scope="module")
def head_dir(tiny_models, tmp_path_factory):
    return make_head_dir(tiny_models, tmp_path_factory)


@pytest.fixture(scope="module")
def plain(head_dir):
    return _plain(head_dir, PARAMS)


@pytest.fixture(scope="module")
def plain_seeded(head_dir):
    return _plain(head_dir, SEEDED)


WORDS = "one two three four five six seven eight nine ten eleven twelve".split()  # noqa: SIM905
# a bucket of 16 on a GPU (larger than any other test's), of 8 on Triton's CPU interpreter
MANY = [" ".join(WORDS[i:] + WORDS[: i % 4]) for i in range(10 if DEVICE == "cuda" else 5)]


def _rounds_by_lane(engine, prompts) -> dict[tuple, dict[int, tuple]]:
    """The head's own device rounds: each lane's round results by verify position (the
    verify's tokens past the kept drafts follow the drafts, so equal results mean equal
    drafts)."""
    seen: dict[tuple, dict[int, tuple]] = {}
    dr = engine.device_rounds
    take = dr.take

    def recording():
        results = take()
        for lane, r in zip(dr.lanes, results, strict=True):
            seen.setdefault(tuple(lane.prompt_ids), {})[r.verify_start] = (r.tokens, r.accepted)
        return results

    dr.take = recording
    engine.generate(prompts, dataclasses.replace(PARAMS, max_tokens=10))
    assert dr.num_rounds > 0
    return seen


def _rows_of_the_next_lane(self):
    """Negative control: the catch-up's logits row of lane i taken from lane i + 1."""
    original_layout(self)
    self.rows.copy_(self.rows.roll(-1))


original_layout = _Bucket.layout


@pytest.mark.parametrize("broken", [False, True], ids=["rounds", "negative-control-rows"])
def test_a_lane_among_others_rounds_as_it_does_alone(head_dir, broken, monkeypatch):
    """Every round of a lane in a larger bucket (graph-replayed on a GPU) has the results it has
    when the lane runs alone: the drafts, and so the acceptance, do not depend on the lanes
    beside it. With each lane's head reading its neighbour's row, they do."""
    if broken:
        monkeypatch.setattr(_Bucket, "layout", _rows_of_the_next_lane)
    together = _rounds_by_lane(_engine(head_dir, device_rounds=True), MANY)
    differ = compared = 0
    for prompt in MANY[:2] if DEVICE == "cuda" else MANY[:1]:
        ((key, alone),) = _rounds_by_lane(_engine(head_dir, device_rounds=True), [prompt]).items()
        common = set(alone) & set(together[key])
        compared += len(common)
        differ += sum(alone[v] != together[key][v] for v in common)
    assert compared >= 5
    assert differ > 0 if broken else differ == 0


class TreeOracle:
    """Draft trees in device rounds (lanes/device_round_trees.py), drafts that know the
    undrafted output: branch 0 is wrong where pos * 5 % 11 < 3, branch 1 wherever branch 0 is
    right at its first draft and where pos * 3 % 7 == 0 later, branch 2 always; so rounds keep
    branch 0 or branch 1, and every count of drafts."""

    def __init__(self, rounds: DeviceRounds, plain: dict[tuple, list[int]]) -> None:
        self.rounds, self.plain = rounds, plain
        rounds.pool = None  # eager rounds, on the GPU too
        rounds.buckets.clear()
        rounds.sample, rounds.alternatives = self.sample, self.alternatives

    def right(self, row: int, pos: int) -> int:
        lanes = self.rounds.lanes
        if row >= len(lanes):
            return 0
        tokens = self.plain[tuple(lanes[row].prompt_ids)]
        at = pos - len(lanes[row].prompt_ids)
        return tokens[at] if 0 <= at < len(tokens) else 0

    def sample(self, logits, positions, params):
        w, out = self.rounds.branches, positions.tolist()
        per_lane = len(out) != self.rounds.bucket.lanes  # the branches' rows, lane-major
        for r, pos in enumerate(out):
            lane, branch = (r // w, r % w) if per_lane else (r, 0)
            right = self.right(lane, pos)
            wrong = (pos * 5 % 11 < 3) if branch == 0 else (pos * 3 % 7 == 0 or branch == 2)
            out[r] = (right + 1 + branch) % 256 if wrong else right
        return torch.tensor(out, dtype=torch.int64, device=logits.device)

    def alternatives(self, logits, first, n):
        firsts = first.tolist()
        positions = self.rounds.bucket.values[self.rounds.bucket.num_head_positions :]
        starts = positions.view(self.rounds.bucket.lanes, -1)[:, 0].tolist()
        out = []
        for i, (f, start) in enumerate(zip(firsts, starts, strict=True)):
            right = self.right(i, start + 1)
            one = right if f != right else (right + 7) % 256  # right where branch 0 is not
            out.append([one] + [(right + 3 + j) % 256 for j in range(n - 1)])
        return torch.tensor(out, dtype=torch.int64, device=first.device)


@pytest.mark.parametrize("seeded", [False, True], ids=["greedy", "seeded"])
def test_device_rounds_with_draft_trees_emit_the_undrafted_tokens(
    head_dir, plain, plain_seeded, seeded
):
    """Three branches per lane in every round: the tokens and logprobs are draft: false's, and
    rounds kept branch 1 (its K/V moved into the lane's own slots on the device)."""
    params, want = (SEEDED, plain_seeded) if seeded else (PARAMS, plain)
    engine = _engine(head_dir, device_rounds=True, draft_branches=3)
    assert engine.device_rounds.branches == 3
    TreeOracle(engine.device_rounds, {k: c.token_ids for k, c in want.items()})
    got = engine.generate(PROMPTS, params)
    assert engine.device_rounds.num_rounds > 0
    assert engine.metrics.num_branches_followed > 0
    for g in got:
        w = want[tuple(g.prompt_ids)]
        assert (g.token_ids, g.logprobs) == (w.token_ids, w.logprobs)
    engine.check_integrity()


@pytest.mark.parametrize("broken", ["kv-not-moved", "sibling-rows"])
def test_negative_control_device_trees_without_the_branch_layout_fail(
    head_dir, plain, monkeypatch, broken
):
    """The kept branch's K/V left in its scratch slots, or branch rows reading the lane's own
    rows past the fork (a sibling's): the output is no longer the undrafted one."""
    from lanes.device_round_trees import BranchLayout

    if broken == "kv-not-moved":
        monkeypatch.setattr(BranchLayout, "adopt", lambda self, kv, branch, slots: None)
    else:
        layout = BranchLayout.layout

        def sibling_rows(self, lane_head_kv, lane_target_kv, *rest):
            layout(self, lane_head_kv, lane_target_kv, *rest)
            w = self.w  # the branches' context rows back to the lane's own (branch 0's) rows
            self.target_kv.view(self.lanes, w, -1).copy_(
                lane_target_kv.view(self.lanes, 1, -1).expand(-1, w, -1)
            )

        monkeypatch.setattr(BranchLayout, "layout", sibling_rows)
    engine = _engine(head_dir, device_rounds=True, draft_branches=3)
    TreeOracle(engine.device_rounds, {k: c.token_ids for k, c in plain.items()})
    got = engine.generate(PROMPTS, PARAMS)
    assert [g.token_ids for g in got] != [plain[tuple(g.prompt_ids)].token_ids for g in got]
