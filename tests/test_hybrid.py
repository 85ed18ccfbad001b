"""Qwen3.5 hybrids (gated DeltaNet + gated attention; lanes/models/deltanet.py): against
transformers over many prefill chunks, chunk invariance, the equalities (concurrent == solo,
drafted == undrafted with the recurrent state rolled back, a cancelled request's retry == fresh),
each with a negative control, the vision-language wrapper's text part, refused configurations."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from lanes import EngineConfig, SamplingParams, build_engine
from lanes.cache.state_pool import StatePool
from lanes.config import ConfigError, ModelConfig
from lanes.drafter.replay import ReplayProposer
from tests.conftest import matches_transformers_over_chunks

PROMPTS = [
    "The quick brown fox jumps over the lazy dog " * 3,
    "Paris is the capital of France; Berlin is",
    "def add(a, b):\n    return a + b\n" * 4,
    "fox",
]
GREEDY = SamplingParams(max_tokens=20, ignore_eos=True)
SEEDED = SamplingParams(max_tokens=20, ignore_eos=True, temperature=0.8, top_p=0.9, seed=7)


@pytest.fixture(scope="module", params=["qwen3_5", "qwen3_5_moe"])
def hybrid(tiny_models, request):
    return tiny_models[request.param]


def test_config_reads_the_layer_layout(hybrid):
    engine = build_engine(str(hybrid[0]))
    cfg = engine.model_config
    assert cfg.linear_layers == (0, 1, 2) and cfg.attention_layers == (3,)
    assert cfg.rope_dim == 4 and cfg.attn_output_gate and cfg.zero_centred_norms
    assert engine.runner.kv.k.shape[0] == 1  # KV only for the attention layer
    assert engine.states.num_slots == engine.config.max_lanes
    layers = engine.runner.decoder.weights.layers
    if cfg.family == "qwen3_5_moe":  # routed experts + the gated shared expert, every layer
        assert cfg.moe_layers == (0, 1, 2, 3) and cfg.norm_topk_prob
        assert all(x.router is not None and x.shared_gate is not None for x in layers)


def test_greedy_tokens_and_logits_match_transformers_over_many_chunks(hybrid):
    path, hf = hybrid
    matches_transformers_over_chunks(path, hf, PROMPTS[0] * 3, 32)


def test_chunk_boundaries_do_not_change_a_bit(hybrid):
    """Prefill in 16-token chunks, 32-token chunks and one forward: the same logprobs, bitwise
    (the recurrence runs position by position on shapes fixed by the model)."""
    ids = build_engine(str(hybrid[0])).tokenizer.encode(PROMPTS[2] * 2)
    seen = []
    for chunk in (16, 32, 512):
        engine = build_engine(str(hybrid[0]), EngineConfig(prefill_chunk=chunk))
        (out,) = engine.generate([ids], SEEDED)
        seen.append((out.token_ids, out.logprobs))
    assert seen[0] == seen[1] == seen[2]


def _solo_and_batched(engine, params):
    solo = [engine.generate([p], params)[0] for p in PROMPTS]
    return solo, engine.generate(PROMPTS, params)


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_concurrent_equals_solo(hybrid, params):
    engine = build_engine(str(hybrid[0]), EngineConfig(max_tokens_per_round=40))
    solo, batched = _solo_and_batched(engine, params)
    for s, b in zip(solo, batched, strict=True):
        assert (b.token_ids, b.logprobs) == (s.token_ids, s.logprobs)  # bitwise
    engine.check_integrity()


def test_negative_control_fast_ops_depend_on_the_batch(hybrid):
    engine = build_engine(str(hybrid[0]), EngineConfig(max_tokens_per_round=40, exact=False))
    solo, batched = _solo_and_batched(engine, GREEDY)
    assert any(s.logprobs != b.logprobs for s, b in zip(solo, batched, strict=True))


def _replayed(engine, params, acceptance):
    """Drafts from a replay of the undrafted output at this acceptance (rejections included)."""
    plain = engine.generate(PROMPTS, dataclasses.replace(params, draft=False))
    records = {tuple(engine.encode(p)): c.token_ids for p, c in zip(PROMPTS, plain, strict=True)}
    engine.proposer = ReplayProposer(records, acceptance, engine.model_config.vocab_size)
    return plain, engine.generate(PROMPTS, params, cache_salt="drafted")


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_drafted_equals_undrafted(hybrid, params):
    """Verify forwards run the drafts through the DeltaNet layers; the state is rolled back to
    the last accepted position (StatePool.settle)."""
    engine = build_engine(str(hybrid[0]), EngineConfig(num_draft_tokens=4, adaptive_drafts=False))
    plain, drafted = _replayed(engine, params, 0.5)
    assert sum(d.num_drafted - d.num_accepted for d in drafted) > 0  # drafts were rejected
    for d, p in zip(drafted, plain, strict=True):
        assert (d.token_ids, d.logprobs) == (p.token_ids, p.logprobs)
    engine.check_integrity()


def test_negative_control_without_rollback(hybrid, monkeypatch):
    """Without putting the state back after rejected drafts, the state check fails the lanes;
    with the check off too, the output changes."""
    engine = build_engine(str(hybrid[0]), EngineConfig(num_draft_tokens=4, adaptive_drafts=False))
    monkeypatch.setattr(StatePool, "settle", lambda self, slot, num_computed: None)
    _, drafted = _replayed(engine, GREEDY, 0.5)
    assert any(d.finish_reason == "error" for d in drafted)

    def unchecked(self, slot, layer, position):  # the slot's state, whatever it has seen
        conv, state = self.conv[slot, layer].clone(), self.recurrent[slot, layer].clone()
        return (conv * 0, state * 0) if position == 0 else (conv, state)

    monkeypatch.setattr(StatePool, "read", unchecked)
    engine = build_engine(str(hybrid[0]), EngineConfig(num_draft_tokens=4, adaptive_drafts=False))
    plain, drafted = _replayed(engine, GREEDY, 0.5)
    assert all(d.finish_reason != "error" for d in drafted)
    assert any(d.token_ids != p.token_ids for d, p in zip(drafted, plain, strict=True))


def test_drafted_equals_undrafted_with_ngram(hybrid):
    engine = build_engine(str(hybrid[0]), EngineConfig(drafter="ngram"))
    drafted = engine.generate(PROMPTS, GREEDY)
    plain = engine.generate(PROMPTS, dataclasses.replace(GREEDY, draft=False))
    assert [(d.token_ids, d.logprobs) for d in drafted] == [
        (p.token_ids, p.logprobs) for p in plain
    ]


def test_cancelled_prefill_retry_equals_fresh(hybrid):
    """No state snapshots in the prompt cache yet: a hybrid never resumes a cached prefix, so a
    cancelled request's retry recomputes its prompt and equals a fresh run."""
    engine = build_engine(str(hybrid[0]), EngineConfig(prefill_chunk=16, max_tokens_per_round=16))
    ids = engine.tokenizer.encode(PROMPTS[0] * 3)
    (fresh,) = engine.generate([ids], SEEDED)
    lane = engine.submit(ids, SEEDED)
    for _ in range(3):
        engine.step()
    assert 0 < lane.num_computed < len(ids)
    engine.cancel(lane.request_id)
    engine.step()
    assert lane.is_finished
    (retry,) = engine.generate([ids], SEEDED)
    assert retry.cached_tokens == 0 and engine.cached_prefix_len(ids) == 0
    assert (retry.token_ids, retry.logprobs) == (fresh.token_ids, fresh.logprobs)
    engine.check_integrity()


def test_vision_language_wrapper_serves_its_text_part(hybrid, tmp_path):
    """Qwen3_5ForConditionalGeneration checkpoints: text_config, model.language_model.* keys, a
    vision tower that is skipped. Same logits as the text model, bitwise."""
    path, _ = hybrid
    text_cfg = json.loads((path / "config.json").read_text())
    tensors = load_file(str(path / "model.safetensors"))
    wrapped = {k.replace("model.", "model.language_model.", 1): v for k, v in tensors.items()}
    wrapped["model.visual.patch_embed.proj.weight"] = torch.zeros(8, 3)
    out = tmp_path / "vl"
    out.mkdir()
    save_file(wrapped, str(out / "model.safetensors"))
    wrapper = text_cfg["architectures"][0].replace("ForCausalLM", "ForConditionalGeneration")
    config = {
        "architectures": [wrapper],
        "model_type": "qwen3_5",
        "text_config": {**text_cfg, "architectures": None},
        "vision_config": {"depth": 1},
    }
    (out / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (out / name).write_text((path / name).read_text())
    ids = list(range(3, 60))
    (want,) = build_engine(str(path)).prompt_logits([ids])
    (got,) = build_engine(str(out)).prompt_logits([ids])
    assert torch.equal(got, want)


def test_unsupported_hybrid_configs_are_refused(hybrid):
    base = json.loads((hybrid[0] / "config.json").read_text())
    assert ModelConfig.from_hf(base).is_hybrid
    bad = {
        "layer_types": [
            "linear_attention",
            "sliding_attention",
            "linear_attention",
            "full_attention",
        ],
        "linear_num_value_heads": 3,
        "hidden_act": "gelu",
        "linear_conv_kernel_dim": 0,
    }
    for field, value in bad.items():
        with pytest.raises(ConfigError, match=field):
            ModelConfig.from_hf({**base, field: value})
    with pytest.raises(ConfigError, match="text_config"):
        ModelConfig.from_hf({"architectures": ["Qwen3_5ForConditionalGeneration"]})
