"""Rejection-mode verification keeps the target's distribution; no KV leaks through thousands of
accept/reject cycles with cancellations; real weights with the n-gram drafter."""

from __future__ import annotations

import random

import pytest
import torch

from lanes import EngineConfig, SamplingParams, build_engine
from lanes.drafter.model import ModelDrafter
from lanes.drafter.ngram import NgramProposer
from lanes.drafter.replay import ReplayProposer
from lanes.models import open_checkpoint
from lanes.sampling import gumbel_noise, noise_hash, uniform_at, uniform_noise
from lanes.speculation import verify

VOCAB = 8
CHI2_CRITICAL_DF7_P001 = 24.322  # chi-square quantile, 7 degrees of freedom, p = 0.001


def _first_token_counts(n: int, accept_all: bool = False) -> tuple[list[int], torch.Tensor]:
    """Emitted first tokens of rejection verification, the draft drawn from q, over n samples."""
    target_logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -0.5, 1.5, -1.0, 0.2]] * 2)
    draft_logits = torch.tensor([0.0, 2.0, 1.0, 0.5, 0.0, -1.0, 0.5, 1.0])
    q_log = torch.log_softmax(draft_logits, dim=-1)
    counts = [0] * VOCAB
    for i in range(n):
        seed, pos = 1000 + i, 7
        d = int(torch.argmax(q_log + gumbel_noise(seed + 10**6, pos, VOCAB)))  # d ~ q
        params = SamplingParams(temperature=1.0, seed=seed)
        out = verify("rejection", target_logits, (d,), q_log.unsqueeze(0), params, pos)
        counts[d if accept_all else out[0][0]] += 1
    return counts, torch.softmax(target_logits[0], dim=-1)


def _chi2(counts: list[int], p: torch.Tensor) -> float:
    n = sum(counts)
    return sum((c - n * float(pi)) ** 2 / (n * float(pi)) for c, pi in zip(counts, p, strict=True))


def test_host_draws_are_the_noise_tensor_bit_for_bit():
    """The accept test and the replay drafter draw with uniform_at (plain Python, no tensor);
    it gives the float32 bits of uniform_noise."""
    rng = random.Random(3)
    for _ in range(500):
        seed, pos, stream = rng.getrandbits(63), rng.randrange(2**31), rng.randrange(4)
        want = uniform_noise(seed, pos, 6, stream).tolist()
        assert [uniform_at(seed, pos, stream, i) for i in range(6)] == want


def test_rejection_mode_preserves_the_target_distribution():
    counts, p = _first_token_counts(20000)
    assert _chi2(counts, p) < CHI2_CRITICAL_DF7_P001


def test_negative_control_keeping_every_draft_follows_the_drafter():
    counts, p = _first_token_counts(20000, accept_all=True)
    assert _chi2(counts, p) > CHI2_CRITICAL_DF7_P001


def test_rejection_mode_runs_in_the_engine(llama_dir):
    ckpt = open_checkpoint(str(llama_dir))
    engine = build_engine(
        str(llama_dir),
        EngineConfig(verify_mode="rejection"),
        proposer=ModelDrafter(ckpt, ckpt.tokenizer, EngineConfig()),
    )
    greedy = SamplingParams(max_tokens=20, ignore_eos=True)
    plain = build_engine(str(llama_dir)).generate([[5, 6, 7]], greedy)[0]
    # greedy rejection verification is exact too; sampled keeps the right length and accepts all
    assert engine.generate([[5, 6, 7]], greedy)[0].token_ids == plain.token_ids
    out = engine.generate(
        [[5, 6, 7]], SamplingParams(max_tokens=20, ignore_eos=True, temperature=1.0, seed=1)
    )[0]
    assert len(out.token_ids) == 20 and out.num_accepted == out.num_drafted  # self-drafting: p == q


def test_no_kv_leak_through_accept_reject_cycles_and_cancellations(llama_dir):
    rng = random.Random(11)
    prompts = [[rng.randrange(3, 380) for _ in range(rng.randint(3, 40))] for _ in range(12)]
    base = build_engine(str(llama_dir))
    records = {
        tuple(p): base.generate([p], SamplingParams(max_tokens=60, ignore_eos=True))[0].token_ids
        for p in prompts
    }
    ckpt = open_checkpoint(str(llama_dir))
    for proposer in (
        ReplayProposer(records, 0.6, ckpt.config.vocab_size),
        ModelDrafter(
            ckpt.first_layers(1), ckpt.tokenizer, EngineConfig(draft_kv_cache_bytes=2**17)
        ),
    ):
        config = EngineConfig(kv_cache_bytes=2**18, max_lanes=6)
        engine = build_engine(str(llama_dir), config, proposer=proposer)
        live: list[int] = []
        for _ in range(400):
            if rng.random() < 0.25:
                live.append(
                    engine.add_request(
                        rng.choice(prompts),
                        SamplingParams(max_tokens=rng.randint(1, 60), ignore_eos=True),
                    )
                )
            if live and rng.random() < 0.05:
                engine.cancel(live.pop(rng.randrange(len(live))))  # often during decode
            for c in engine.step():
                if c.request_id in live:
                    live.remove(c.request_id)
            engine.check_integrity()
            if isinstance(proposer, ModelDrafter):
                proposer.check_integrity()
        while engine.has_work():
            engine.step()
        engine.check_integrity()
        assert engine.metrics.num_verify_steps > 300
        assert 0 < engine.metrics.num_accepted < engine.metrics.num_drafted
        if isinstance(proposer, ModelDrafter):
            assert not proposer.shadows and proposer.pool.num_used == 0


@pytest.mark.slow
def test_default_model_ngram_acceptance_and_equality():
    from lanes.models.resolve import default_gguf

    path = str(default_gguf())
    text = (
        "Here is some Python code:\n\ndef add(a, b):\n    return a + b\n\n"
        "Rewrite the function add with type hints, keeping the body the same."
    )
    chat = [{"role": "user", "content": text}]
    params = SamplingParams(max_tokens=48, ignore_eos=True)
    plain = build_engine(path).generate([chat], params)[0]
    engine = build_engine(path, proposer=NgramProposer())
    drafted = engine.generate([chat], params)[0]
    assert drafted.token_ids == plain.token_ids
    assert drafted.num_drafted > 0 and drafted.num_accepted / drafted.num_drafted > 0.3


def _largest_hash_draw() -> tuple[int, int, int]:
    """A (seed, position, token) whose hash has its 24 high bits all set: the draw that
    float32((2**24 - 1) + 0.5) / 2**24 = 1.0 once turned into infinite Gumbel noise."""
    for seed in range(1000):
        hits = ((noise_hash(seed, 7, 2**20) >> 8) == 2**24 - 1).nonzero()
        if len(hits):
            return seed, 7, int(hits[0])
    raise AssertionError("no such draw among 1000 seeds")


def test_the_largest_hash_draws_finite_noise_and_stays_in_the_sampled_set():
    """Every uniform is strictly below 1, so no token's Gumbel noise is infinite: a token
    outside top-k is never drawn, even the one holding the largest hash (before the fix the
    host sampler drew it, with logprob -inf, about once in 16.7M token draws)."""
    from lanes.sampling import SamplingParams, sample_row

    seed, pos, token = _largest_hash_draw()
    u = uniform_noise(seed, pos, token + 1)[token]
    assert float(u) == 1 - 2**-24 and uniform_at(seed, pos, 0, token) == float(u)
    assert torch.isfinite(gumbel_noise(seed, pos, token + 1)).all()
    logits = torch.zeros(token + 1)
    logits[:8] = 5.0  # the top-k set; the token with the largest hash is outside it
    params = SamplingParams(temperature=1.0, top_k=8, seed=seed)
    drawn, logprobs = sample_row(logits, params, pos, seed)
    assert drawn < 8 and torch.isfinite(logprobs[drawn])
