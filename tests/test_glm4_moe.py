"""GLM-4 MoE (Glm4MoeForCausalLM): sigmoid-scored grouped routing with a correction bias, an
ungated shared expert, a dense first layer, partial RoPE, q/k norms and qkv bias — against
transformers (also in tests/test_models_vs_transformers.py), with each routing detail's
negative control, and the three equalities, greedy and seeded."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from lanes import EngineConfig, SamplingParams, build_engine
from lanes.models import open_checkpoint
from lanes.models.moe import route_groups
from tests.conftest import matches_transformers_over_chunks
from tests.test_moe import PROMPTS, _solo_and_batched

GREEDY = SamplingParams(max_tokens=20, ignore_eos=True)
SEEDED = SamplingParams(max_tokens=20, ignore_eos=True, temperature=0.8, top_p=0.9, seed=7)


@pytest.fixture(scope="module")
def glm(tiny_models):
    return tiny_models["glm4_moe"]


def test_config_reads_the_glm_layout(glm):
    cfg = open_checkpoint(str(glm[0])).config
    assert (cfg.family, cfg.router, cfg.n_group, cfg.topk_group) == (
        "glm4_moe",
        "sigmoid_groups",
        2,
        1,
    )
    assert cfg.moe_layers == (1,) and cfg.routed_scaling_factor == 2.5
    assert (cfg.shared_expert_intermediate_size, cfg.shared_expert_gated) == (64, False)
    assert (cfg.rope_dim, cfg.head_dim, cfg.qk_norm, cfg.qkv_bias) == (8, 16, True, True)


def test_logits_match_transformers_over_many_prefill_chunks(glm):
    matches_transformers_over_chunks(glm[0], glm[1], PROMPTS[0] * 3, 24)


def test_routing_keeps_to_the_best_groups_and_breaks_ties_by_id():
    cfg = dataclasses.replace(
        open_checkpoint_config(), n_group=2, topk_group=1, norm_topk_prob=True,
        routed_scaling_factor=2.0,
    )  # fmt: skip
    # group 0 (experts 0-3) holds the single best expert, group 1 the better best two
    logits = torch.tensor([[4.0, -4.0, -4.0, -4.0, 2.0, 2.0, 2.0, 1.0]])
    weights, experts = route_groups(logits, torch.zeros(8), 2, cfg)
    assert experts.tolist() == [[4, 5]]  # group 1 wins (2 + 2 > 4 - 4); ties by lower id
    torch.testing.assert_close(weights.sum(-1), torch.tensor([2.0]))  # renormalised, scaled
    bias = torch.zeros(8)
    bias[6] = 0.5  # the bias moves the choice, not the weight
    weights, experts = route_groups(logits, bias, 2, cfg)
    assert experts.tolist() == [[6, 4]]
    torch.testing.assert_close(weights[0, 0], weights[0, 1])


def open_checkpoint_config():
    from lanes.config import ModelConfig

    return ModelConfig(family="glm4_moe", vocab_size=8, hidden_size=8, intermediate_size=8,
                       num_layers=1, num_heads=1, num_kv_heads=1, head_dim=8, rms_norm_eps=1e-5,
                       rope_theta=1e4, max_position_embeddings=8, tie_word_embeddings=False,
                       num_experts=8, experts_per_token=2, router="sigmoid_groups")  # fmt: skip


@pytest.mark.parametrize("change", ["no bias", "no scaling", "all groups"])
def test_negative_control_each_routing_detail_matters(glm, change):
    """Each detail changed alone moves the logits off transformers' (so the match above checks
    it)."""
    path, hf = glm
    ckpt = open_checkpoint(str(path))
    cfg = ckpt.config
    if change == "no scaling":
        ckpt = dataclasses.replace(ckpt, config=dataclasses.replace(cfg, routed_scaling_factor=1.0))
    elif change == "all groups":
        ckpt = dataclasses.replace(ckpt, config=dataclasses.replace(cfg, topk_group=cfg.n_group))
    engine = build_engine(checkpoint=ckpt)
    if change == "no bias":
        for layer in engine.runner.decoder.weights.layers:
            if layer.router_bias is not None:
                layer.router_bias.zero_()
    ids = engine.tokenizer.encode(PROMPTS[0] * 2)
    (ours,) = engine.prompt_logits([ids])
    with torch.no_grad():
        theirs = hf(torch.tensor([ids])).logits[0].float()
    assert not torch.allclose(ours, theirs, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_concurrent_equals_solo_and_drafted_equals_undrafted(glm, params):
    engine = build_engine(str(glm[0]), EngineConfig(max_tokens_per_round=40, drafter="ngram"))
    solo, batched = _solo_and_batched(engine, params)
    for s, b in zip(solo, batched, strict=True):
        assert (b.token_ids, b.logprobs) == (s.token_ids, s.logprobs)
    plain = engine.generate(PROMPTS, dataclasses.replace(params, draft=False))
    assert [(p.token_ids, p.logprobs) for p in plain] == [
        (b.token_ids, b.logprobs) for b in batched
    ]


def test_negative_control_fast_glm_depends_on_the_batch(glm):
    engine = build_engine(str(glm[0]), EngineConfig(max_tokens_per_round=40, exact=False))
    solo, batched = _solo_and_batched(engine, GREEDY)
    assert any(s.logprobs != b.logprobs for s, b in zip(solo, batched, strict=True))


@pytest.mark.parametrize("seeded", [False, True], ids=["greedy", "seeded"])
def test_resumed_equals_fresh(glm, seeded):
    from tests.test_cancel import assert_resumed_equals_fresh

    assert_resumed_equals_fresh(glm[0], seeded)


def test_negative_control_a_plain_sigmoid_makes_rows_depend_on_their_place(glm, monkeypatch):
    """torch.sigmoid over [tokens, 8 experts] rounds a row in the tensor's scalar tail otherwise
    than in its SIMD body (seen on the dev box's CPU): concurrent then differs from solo."""
    import lanes.models.moe as moe

    monkeypatch.setattr(moe, "_rowwise_sigmoid", torch.sigmoid)
    engine = build_engine(str(glm[0]), EngineConfig(max_tokens_per_round=40))
    solo, batched = _solo_and_batched(engine, GREEDY)
    assert any(s.logprobs != b.logprobs for s, b in zip(solo, batched, strict=True))


def test_on_the_triton_ops_glm_greedy_equals_transformers(glm):
    path, hf = glm
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = EngineConfig(kernels="triton", device=device, dtype="float32", max_tokens_per_round=40)
    engine = build_engine(str(path), cfg)
    ids = engine.tokenizer.encode(PROMPTS[1])
    (out,) = engine.generate([ids], SamplingParams(max_tokens=6, ignore_eos=True))
    hf.generation_config.eos_token_id = None
    with torch.no_grad():
        ref = hf.generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert out.token_ids == ref[0, len(ids) :].tolist()


def test_the_multi_token_prediction_layers_of_a_checkpoint_are_left_aside(glm):
    """GLM-4.5 checkpoints carry MTP layers after the decoder's (transformers skips them too)."""
    from lanes.models.weights import WeightError, check_shapes

    ckpt = open_checkpoint(str(glm[0]))
    extra = {**ckpt.shapes, "model.layers.2.eh_proj.weight": (64, 128)}
    check_shapes(extra, ckpt.config)
    other = dataclasses.replace(ckpt.config, family="qwen3_moe", router="softmax")
    with pytest.raises(WeightError, match="unexpected: .*model.layers.2.eh_proj.weight"):
        check_shapes(extra, other)
