"""Qwen3-MoE (lanes/models/moe.py): against transformers over many prefill chunks, routing ties,
the three equalities (concurrent == solo, drafted == undrafted, resumed == fresh),
and batch invariance — a token's output does not depend on which other tokens share its
experts (negative control: the fast ops' BLAS calls of varying size do)."""

from __future__ import annotations

import pytest
import torch

from lanes import EngineConfig, SamplingParams, build_engine
from lanes.config import ConfigError, ModelConfig
from lanes.kernels.moe_route import ref_route_experts as route
from tests.conftest import matches_transformers_over_chunks
from tests.replay_drafts import drafted_equals_replayed

PROMPTS = [
    "The quick brown fox jumps over the lazy dog " * 3,
    "Paris is the capital of France; Berlin is",
    "def add(a, b):\n    return a + b\n" * 4,
    "fox",
]


@pytest.fixture(scope="module")
def moe(tiny_models):
    path, hf = tiny_models["qwen3_moe"]
    return path, hf


def test_config_reads_the_expert_layout(moe):
    path, hf = moe
    engine = build_engine(str(path))
    cfg = engine.model_config
    assert (cfg.num_experts, cfg.experts_per_token, cfg.moe_intermediate_size) == (8, 2, 48)
    assert cfg.moe_layers == (0,) and cfg.norm_topk_prob  # layer 1 is in mlp_only_layers
    layers = engine.runner.decoder.weights.layers
    assert layers[0].router is not None and layers[1].router is None


def test_logits_match_transformers_over_many_prefill_chunks(moe):
    path, hf = moe
    matches_transformers_over_chunks(path, hf, PROMPTS[0] * 3, 24)


def test_routing_breaks_ties_by_expert_id_and_renormalises():
    logits = torch.tensor([[0.0, 2.0, 2.0, 1.0, 2.0], [3.0, 3.0, 3.0, 3.0, 3.0]])
    weights, experts = route(logits, 3, normalise=True)
    assert experts.tolist() == [[1, 2, 4], [0, 1, 2]]
    torch.testing.assert_close(weights.sum(-1), torch.ones(2))
    raw, _ = route(logits, 3, normalise=False)
    assert (raw.sum(-1) < 1).all()


def _solo_and_batched(engine, params):
    solo = [engine.generate([p], params)[0] for p in PROMPTS]
    return solo, engine.generate(PROMPTS, params)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_tokens=20, ignore_eos=True),
        SamplingParams(max_tokens=20, ignore_eos=True, temperature=0.8, top_p=0.9, seed=7),
    ],
    ids=["greedy", "seeded"],
)
def test_concurrent_equals_solo(moe, params):
    engine = build_engine(str(moe[0]), EngineConfig(max_tokens_per_round=40))
    solo, batched = _solo_and_batched(engine, params)
    for s, b in zip(solo, batched, strict=True):
        assert (b.token_ids, b.logprobs) == (s.token_ids, s.logprobs)  # bitwise


def test_negative_control_fast_moe_depends_on_the_batch(moe):
    engine = build_engine(str(moe[0]), EngineConfig(max_tokens_per_round=40, exact=False))
    solo, batched = _solo_and_batched(engine, SamplingParams(max_tokens=20, ignore_eos=True))
    assert any(s.logprobs != b.logprobs for s, b in zip(solo, batched, strict=True))


def test_drafted_equals_undrafted_with_ngram(moe):
    engine = build_engine(str(moe[0]), EngineConfig(drafter="ngram"))
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    import dataclasses

    drafted = engine.generate(PROMPTS, params)
    plain = engine.generate(PROMPTS, dataclasses.replace(params, draft=False))
    assert [d.token_ids for d in drafted] == [p.token_ids for p in plain]
    assert [d.logprobs for d in drafted] == [p.logprobs for p in plain]


def test_on_the_triton_ops_experts_are_grouped_on_the_device(moe, monkeypatch):
    """The MoE through the Triton ops (interpreted on the CPU, native on a GPU): the routed
    MLPs run as grouped launches (kernels/expert_matmul.py), never the per-expert loop that reads
    the routing on the host, and the routing and weighted sum as a launch each; greedy tokens equal transformers', seeded concurrent == solo and
    drafted == undrafted bitwise."""
    from lanes.ops import Ops

    def host_loop(*args):
        raise AssertionError("the Triton ops ran the per-expert loop")

    monkeypatch.setattr(Ops, "experts", host_loop)
    monkeypatch.setattr(Ops, "route_experts", host_loop)  # one launch: kernels/moe_route.py
    monkeypatch.setattr(Ops, "combine_experts", host_loop)
    path, hf = moe
    device = "cuda" if torch.cuda.is_available() else "cpu"
    base = dict(kernels="triton", device=device, dtype="float32", max_tokens_per_round=40)
    engine = build_engine(str(path), EngineConfig(**base))
    assert engine.ops.name == "triton"
    ids = engine.tokenizer.encode(PROMPTS[1])
    (out,) = engine.generate([ids], SamplingParams(max_tokens=6, ignore_eos=True))
    hf.generation_config.eos_token_id = None
    with torch.no_grad():
        ref = hf.generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert out.token_ids == ref[0, len(ids) :].tolist()

    seeded = SamplingParams(max_tokens=6, ignore_eos=True, temperature=0.8, top_p=0.9, seed=7)
    prompts = [ids, engine.tokenizer.encode(PROMPTS[3])]
    solo = [engine.generate([p], seeded)[0] for p in prompts]
    for s, b in zip(solo, engine.generate(prompts, seeded), strict=True):
        assert (b.token_ids, b.logprobs) == (s.token_ids, s.logprobs)

    drafting = build_engine(
        str(path), EngineConfig(**base, num_draft_tokens=3, adaptive_drafts=False)
    )
    drafted_equals_replayed(drafting, prompts, solo, seeded)


def test_bad_expert_layouts_are_refused():
    base = {
        "architectures": ["Qwen3MoeForCausalLM"],
        "vocab_size": 64,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 16,
    }
    assert ModelConfig.from_hf(base).moe_layers == (0, 1)
    for field, value in [
        ("num_experts_per_tok", 5),
        ("moe_intermediate_size", 0),
        ("decoder_sparse_step", 0),
        ("mlp_only_layers", "all"),
    ]:
        with pytest.raises(ConfigError, match=field.split("_")[0]):
            ModelConfig.from_hf({**base, field: value})


def test_what_moe_does_not_support_yet_is_refused(moe, tmp_path):
    import dataclasses

    from lanes.drafter.distill import distill
    from lanes.models import open_checkpoint
    from lanes.parallel import shard_config

    cfg = open_checkpoint(str(moe[0])).config
    shard_config(cfg, 2)  # tensor parallel takes MoE now (tests/test_tensor_parallel.py) ...
    uneven = dataclasses.replace(cfg, moe_intermediate_size=cfg.moe_intermediate_size + 1)
    with pytest.raises(ConfigError, match="moe_intermediate_size"):  # ... when experts split
        shard_config(uneven, 2)
    with pytest.raises(ValueError, match="mixture-of-experts target"):
        distill(str(moe[0]), tmp_path / "head", log=lambda m: None)


@pytest.mark.parametrize("seeded", [False, True], ids=["greedy", "seeded"])
def test_resumed_equals_fresh(moe, seeded):
    """cancel_prefill on a MoE lane keeps its blocks; the retry continues and equals a fresh run
    (tests/test_cancel.py's harness, on the MoE model)."""
    from tests.test_cancel import assert_resumed_equals_fresh

    assert_resumed_equals_fresh(moe[0], seeded)
