"""Draft trees as root-to-leaf branches: the target verifies every branch in one forward, in
scratch slots of each branch's own, and follows its own samples through them — so the output is
undrafted decoding's, token for token and logprob for logprob, greedy and seeded. Negative
controls: a branch that reads its sibling's rows, and a walk that takes a branch the target did
not sample, both change the output."""

from __future__ import annotations

import pytest

import lanes.verifier
from lanes import EngineConfig, SamplingParams, build_engine
from lanes.branch_scratch import BranchScratch
from lanes.drafter.replay import ReplayProposer
from lanes.runner import ModelRunner
from lanes.speculation import walk_branches

PROMPTS = [[5, 6, 7], [9, 3, 3, 8, 1], [2, 4], [7, 7, 1, 2, 3, 4, 5, 6, 11, 12]]
GREEDY = SamplingParams(max_tokens=24, ignore_eos=True, seed=11)  # the replayed drafts' noise
SEEDED = SamplingParams(max_tokens=24, ignore_eos=True, temperature=0.8, top_p=0.9, seed=7)


def test_the_walk_follows_the_targets_samples_through_the_branches():
    paths = [(1, 2, 3), (1, 5, 6), (4, 4)]
    rows = {  # the target's sample at (branch, row)
        (0, 0): 1, (0, 1): 5, (1, 1): 5, (1, 2): 6, (1, 3): 9,
    }  # fmt: skip
    asked = []

    def sample_at(b, j):
        asked.append((b, j))
        return rows[(b, j)], None

    emitted, branch, kept = walk_branches(paths, sample_at)
    assert [t for t, _ in emitted] == [1, 5, 6, 9]
    assert (branch, kept) == (1, 3)  # all three of its drafts, then the bonus token
    # each row asked once, of the lowest branch still followed (branch 0 agreed up to row 1)
    assert asked == [(0, 0), (0, 1), (1, 2), (1, 3)]
    # no branch continues: the root's sample alone
    emitted, branch, kept = walk_branches(paths, lambda b, j: (8, None))
    assert ([t for t, _ in emitted], branch, kept) == ([8], 0, 0)


def test_scratch_slots_are_the_branchs_own_and_bounded():
    scratch = BranchScratch(base=1000, num_lanes=4, branches=3, depth=5)
    seen = set()
    for lane in range(4):
        for b in (1, 2):
            slots = scratch.slots(lane, b, range(5))
            assert not seen & set(slots)
            seen |= set(slots)
    assert min(seen) == 1000 and len(seen) == BranchScratch.num_slots(4, 3, 5)
    with pytest.raises(IndexError):
        scratch.slots(0, 3, range(1))
    with pytest.raises(IndexError):
        scratch.slots(0, 1, range(6))


def _engine(llama_dir, **kw):
    return build_engine(str(llama_dir), EngineConfig(draft_branches=3, **kw))


def _drafted_with_branches(engine, prompts, params):
    """(drafted with replayed branches, plain with draft=False)."""
    plain = engine.generate(prompts, SamplingParams(**{**vars(params), "draft": False}))
    records = {tuple(p): c.token_ids for p, c in zip(prompts, plain, strict=True)}
    engine.proposer = ReplayProposer(records, 0.4, engine.model_config.vocab_size)
    drafted = engine.generate(prompts, params, cache_salt="drafted")
    return drafted, plain


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_branched_drafts_equal_undrafted_decoding(llama_dir, params):
    engine = _engine(llama_dir)
    assert engine.drafting.branches == 3
    drafted, plain = _drafted_with_branches(engine, PROMPTS, params)
    assert engine.metrics.num_branches_followed > 0  # the branches were taken, not just built
    assert sum(d.num_drafted - d.num_accepted for d in drafted) > 0
    for d, p in zip(drafted, plain, strict=True):
        assert (d.token_ids, d.logprobs) == (p.token_ids, p.logprobs)
    engine.check_integrity()


def test_negative_control_a_branch_reading_its_siblings_rows_differs(llama_dir, monkeypatch):
    """The branches read the lane's own rows (branch 0's drafts) from the fork on."""

    def sibling(self, r):
        return self.tables.row(r.slot).slots(r.fork, r.end)

    monkeypatch.setattr(ModelRunner, "_branch_reads", sibling)
    engine = _engine(llama_dir)
    drafted, plain = _drafted_with_branches(engine, PROMPTS, GREEDY)
    assert engine.metrics.num_branches_followed > 0
    assert [d.token_ids for d in drafted] != [p.token_ids for p in plain]


def test_negative_control_a_branch_the_target_did_not_sample_differs(llama_dir, monkeypatch):
    """The walk takes the last branch's first draft whatever the target sampled there."""

    def wrong_walk(paths, sample_at):
        emitted, branch, kept = walk_branches(paths, sample_at)
        if len(paths) < 2 or kept:
            return emitted, branch, kept
        last = len(paths) - 1
        token, logprobs = sample_at(last, 1) if len(paths[last]) > 1 else sample_at(last, 0)
        return [(paths[last][0], emitted[0][1]), (token, logprobs)], last, 1

    monkeypatch.setattr(lanes.verifier, "walk_branches", wrong_walk)
    engine = _engine(llama_dir)
    drafted, plain = _drafted_with_branches(engine, PROMPTS, GREEDY)
    assert [d.token_ids for d in drafted] != [p.token_ids for p in plain]


def test_lanes_with_logits_processing_keep_chains(llama_dir):
    engine = _engine(llama_dir)
    penalised = SamplingParams(max_tokens=12, ignore_eos=True, repetition_penalty=1.3)
    drafted, plain = _drafted_with_branches(engine, PROMPTS[:2], penalised)
    assert engine.metrics.num_branches_followed == 0
    assert [d.token_ids for d in drafted] == [p.token_ids for p in plain]


def test_on_the_device_sampler_branches_equal_undrafted_decoding(llama_dir, monkeypatch):
    """The Triton kernels (interpreted on the CPU): every branch row sampled in the forward's
    one launch, the walk over the samples read back. Negative control: the walk takes a branch
    the target did not sample."""
    import torch

    import lanes.round_execution
    from lanes.speculation import coupled_branches_from_samples

    device = "cuda" if torch.cuda.is_available() else "cpu"
    engine = _engine(llama_dir, kernels="triton", device=device, dtype="float32")
    assert engine.ops.name == "triton"
    host = []
    monkeypatch.setattr(engine.verifier, "verify_branches_on_host", lambda *a: host.append(a))
    short = {"max_tokens": 12}  # the interpreter is slow
    for params in (GREEDY, SEEDED):
        params = SamplingParams(**{**vars(params), **short})
        drafted, plain = _drafted_with_branches(engine, PROMPTS[:2], params)
        assert [d.token_ids for d in drafted] == [p.token_ids for p in plain]
    assert engine.metrics.num_branches_followed > 0 and not host

    def wrong(paths, tokens, logprobs):
        emitted, branch = coupled_branches_from_samples(paths, tokens, logprobs)
        if len(paths) > 1 and branch == 0 and len(emitted) == 1:  # take the last branch's first
            return [(paths[-1][0], logprobs[0]), emitted[0]], len(paths) - 1
        return emitted, branch

    monkeypatch.setattr(lanes.round_execution, "coupled_branches_from_samples", wrong)
    engine = _engine(llama_dir, kernels="triton", device=device, dtype="float32")
    greedy = SamplingParams(**{**vars(GREEDY), **short})
    drafted, plain = _drafted_with_branches(engine, PROMPTS[:2], greedy)
    assert [d.token_ids for d in drafted] != [p.token_ids for p in plain]


def test_branches_through_the_graph_buckets(llama_dir, monkeypatch):
    """Each branch a lane of the CUDA-graph bucket (lanes.graphs; run without capture on the
    CPU): its kv_slots row the lane's slots before the fork and its own after. Drafted output
    equals undrafted, and the verify buckets held branch rows."""
    import torch

    from lanes.graphs import DecodeGraphs

    device = "cuda" if torch.cuda.is_available() else "cpu"
    engine = _engine(
        llama_dir, kernels="triton", device=device, dtype="float32", cuda_graphs=False,
        num_draft_tokens=3, adaptive_drafts=False,
    )  # fmt: skip
    runner, bs = engine.runner, engine.config.block_size
    positions = runner.num_blocks * bs
    runner.graphs = DecodeGraphs(
        runner.decoder, runner.kv, runner.tables, scratch_slot=positions,
        max_ctx=min(runner.decoder.cfg.max_position_embeddings, positions), eager=True,
        branches=runner.branches,
    )  # fmt: skip
    branch_rows = []
    fill = DecodeGraphs._fill
    monkeypatch.setattr(
        DecodeGraphs, "_fill", lambda self, g, steps: (branch_rows.extend(s for s in steps if s.branch), fill(self, g, steps))[1]
    )  # fmt: skip
    params = SamplingParams(**{**vars(GREEDY), "max_tokens": 8})
    drafted, plain = _drafted_with_branches(engine, PROMPTS[:2], params)
    assert branch_rows and runner.graphs.num_replays > 0
    assert engine.metrics.num_branches_followed > 0
    assert [d.token_ids for d in drafted] == [p.token_ids for p in plain]
