"""Random-weight checkpoints of real model shapes, built on the device (no download, no disk):
for GPU benchmarks and the exactness harness, where real weights cannot be carried."""

from __future__ import annotations

import dataclasses
import zlib

import torch
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers

from lanes.config import ModelConfig, RopeScaling
from lanes.models.checkpoint import Checkpoint
from lanes.models.weights import expected_shapes
from lanes.packed import PackedWeight
from lanes.tokenizer import Tokenizer

LLAMA_31_8B = ModelConfig(
    family="llama",
    vocab_size=128256,
    hidden_size=4096,
    intermediate_size=14336,
    num_layers=32,
    num_heads=32,
    num_kv_heads=8,
    head_dim=128,
    rms_norm_eps=1e-5,
    rope_theta=500000.0,
    max_position_embeddings=131072,
    tie_word_embeddings=False,
    rope_scaling=RopeScaling(8.0, 1.0, 4.0, 8192),
    eos_token_ids=(),
)
LLAMA_32_1B = ModelConfig(
    family="llama",
    vocab_size=128256,
    hidden_size=2048,
    intermediate_size=8192,
    num_layers=16,
    num_heads=32,
    num_kv_heads=8,
    head_dim=64,
    rms_norm_eps=1e-5,
    rope_theta=500000.0,
    max_position_embeddings=131072,
    tie_word_embeddings=True,
    rope_scaling=RopeScaling(32.0, 1.0, 4.0, 8192),
    eos_token_ids=(),
)
SMOLLM2_135M = ModelConfig(
    family="llama",
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_layers=30,
    num_heads=9,
    num_kv_heads=3,
    head_dim=64,
    rms_norm_eps=1e-5,
    rope_theta=100000.0,
    max_position_embeddings=8192,
    tie_word_embeddings=True,
    eos_token_ids=(),
)
TINY = ModelConfig(
    family="llama",
    vocab_size=512,
    hidden_size=128,
    intermediate_size=256,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=32,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    max_position_embeddings=8192,
    tie_word_embeddings=False,
    eos_token_ids=(),
)
# A Qwen3.5-2B-like hybrid (issue 18's GPU figures): published Qwen3.5 small configs' layer
# pattern (three gated DeltaNets, then gated attention), DeltaNet heads (16 key and 16 value
# heads of 128), attention heads (8 over 2, head_dim 256, a quarter rotary) and vocabulary, at
# a 2B-like width and depth; not a released model's exact config
QWEN35_2B_LIKE = ModelConfig(
    family="qwen3_5",
    vocab_size=248320,
    hidden_size=2048,
    intermediate_size=6144,
    num_layers=24,
    num_heads=8,
    num_kv_heads=2,
    head_dim=256,
    rms_norm_eps=1e-6,
    rope_theta=10000000.0,
    max_position_embeddings=262144,
    tie_word_embeddings=True,
    qk_norm=True,
    eos_token_ids=(),
    layer_types=tuple(
        "full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(24)
    ),
    rotary_dim=64,
    attn_output_gate=True,
    zero_centred_norms=True,
    linear_num_key_heads=16,
    linear_num_value_heads=16,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_conv_kernel=4,
)
# A Qwen3-30B-A3B-like mixture of experts (issue 18's MoE figures): the published Qwen3-30B-A3B
# config's widths (128 experts of 768, 8 per token, every layer routed, 32 query heads over 4)
QWEN3_30B_A3B_LIKE = ModelConfig(
    family="qwen3_moe",
    vocab_size=151936,
    hidden_size=2048,
    intermediate_size=6144,
    num_layers=48,
    num_heads=32,
    num_kv_heads=4,
    head_dim=128,
    rms_norm_eps=1e-6,
    rope_theta=1000000.0,
    max_position_embeddings=40960,
    tie_word_embeddings=False,
    qk_norm=True,
    eos_token_ids=(),
    num_experts=128,
    experts_per_token=8,
    moe_intermediate_size=768,
    norm_topk_prob=True,
    moe_layers=tuple(range(48)),
)
# A Qwen3.5-35B-A3B-like hybrid MoE: transformers' Qwen3_5MoeTextConfig defaults (40 layers of
# three gated DeltaNets then gated attention, 256 experts of 512, 8 per token, a shared expert
# of 512, 32 value heads over 16 key heads); not a released checkpoint's exact config
QWEN35_35B_A3B_LIKE = dataclasses.replace(
    QWEN35_2B_LIKE,
    family="qwen3_5_moe",
    intermediate_size=512,
    num_layers=40,
    num_heads=16,
    tie_word_embeddings=False,
    layer_types=tuple(
        "full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(40)
    ),
    linear_num_value_heads=32,
    num_experts=256,
    experts_per_token=8,
    moe_intermediate_size=512,
    norm_topk_prob=True,
    moe_layers=tuple(range(40)),
    shared_expert_intermediate_size=512,
)
# the same layout at the TINY width, for GPU tests
TINY_MOE = dataclasses.replace(
    TINY, family="qwen3_moe", qk_norm=True, num_experts=8, experts_per_token=2,
    moe_intermediate_size=64, norm_topk_prob=True, moe_layers=(0, 1),
)  # fmt: skip
# the hybrid layout at a tiny width: CPU dry runs of the hybrid benches (four DeltaNets of
# 2 x 32-dim heads, then gated attention)
TINY_QWEN35 = dataclasses.replace(
    QWEN35_2B_LIKE, vocab_size=512, hidden_size=128, intermediate_size=256, num_layers=4,
    num_heads=4, num_kv_heads=2, head_dim=32, rotary_dim=8, max_position_embeddings=8192,
    layer_types=("linear_attention",) * 3 + ("full_attention",), linear_num_key_heads=2,
    linear_num_value_heads=2, linear_key_head_dim=32, linear_value_head_dim=32,
)  # fmt: skip
# Nemotron-H-8B-like: the published 8B's widths as NemotronHConfig's defaults carry them (52
# blocks "M-M-M-M*-...", 128 Mamba-2 heads of 64 in 8 groups with a state of 128, attention 32
# over 8 heads of 128 without RoPE, ReLU² MLPs of 21,504); read through the config parser
_NEMOTRON_H_8B_FIELDS = {
    "architectures": ["NemotronHForCausalLM"],
    "vocab_size": 131072,
    "hidden_size": 4096,
    "hybrid_override_pattern": "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 21504,
    "mamba_num_heads": 128,
    "mamba_head_dim": 64,
    "ssm_state_size": 128,
    "n_groups": 8,
    "conv_kernel": 4,
    "layer_norm_epsilon": 1e-5,
    "max_position_embeddings": 8192,
    "eos_token_id": [],
}
NEMOTRON_H_8B_LIKE = ModelConfig.from_hf(_NEMOTRON_H_8B_FIELDS)
# its layout at a tiny width: CPU dry runs
TINY_NEMOTRON_H = ModelConfig.from_hf({
    **_NEMOTRON_H_8B_FIELDS, "vocab_size": 512, "hidden_size": 128, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 256, "mamba_num_heads": 8,
    "mamba_head_dim": 16, "ssm_state_size": 16, "n_groups": 2,
    "hybrid_override_pattern": "M-M*-M-",
})  # fmt: skip
# GLM-4.5-Air-like: the published GLM-4.5-Air widths (hidden 4,096; 96 query heads over 8 of
# 128 with half-width RoPE and qkv biases; a dense first layer of 10,944; 128 routed experts of
# 1,408, 8 per token, one shared expert of 1,408; sigmoid routing with a correction bias, one
# group) with 8 layers instead of 46, so its ~34 GB of bf16 weights fit one GPU
_GLM45_AIR_FIELDS = {
    "architectures": ["Glm4MoeForCausalLM"],
    "vocab_size": 151552,
    "hidden_size": 4096,
    "intermediate_size": 10944,
    "num_hidden_layers": 8,
    "num_attention_heads": 96,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "partial_rotary_factor": 0.5,
    "attention_bias": True,
    "use_qk_norm": False,
    "rms_norm_eps": 1e-5,
    "rope_theta": 1000000.0,
    "max_position_embeddings": 131072,
    "n_routed_experts": 128,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 1408,
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
    "n_group": 1,
    "topk_group": 1,
    "routed_scaling_factor": 1.0,
    "norm_topk_prob": True,
    "tie_word_embeddings": False,
    "eos_token_id": [],
}
GLM45_AIR_LIKE = ModelConfig.from_hf(_GLM45_AIR_FIELDS)
# its layout at a tiny width: CPU dry runs
TINY_GLM4_MOE = ModelConfig.from_hf({
    **_GLM45_AIR_FIELDS, "vocab_size": 512, "hidden_size": 128, "intermediate_size": 256,
    "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
    "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
    "n_group": 2, "topk_group": 1, "routed_scaling_factor": 2.5,
})  # fmt: skip
SHAPES = {
    "llama-3.1-8b": LLAMA_31_8B,
    "llama-3.2-1b": LLAMA_32_1B,
    "smollm2-135m": SMOLLM2_135M,
    "qwen3.5-2b-like": QWEN35_2B_LIKE,
    "qwen3-30b-a3b-like": QWEN3_30B_A3B_LIKE,
    "qwen3.5-35b-a3b-like": QWEN35_35B_A3B_LIKE,
    "tiny": TINY,
    "tiny-moe": TINY_MOE,
    "tiny-qwen3.5": TINY_QWEN35,
    "nemotron-h-8b-like": NEMOTRON_H_8B_LIKE,
    "tiny-nemotron-h": TINY_NEMOTRON_H,
    "glm-4.5-air-like": GLM45_AIR_LIKE,
    "tiny-glm4-moe": TINY_GLM4_MOE,
}


def hf_fields(config: ModelConfig) -> dict:
    """The transformers config fields every decoder shares, from a lanes ModelConfig."""
    return dict(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        rms_norm_eps=config.rms_norm_eps,
    )


def hf_random_model(model_class, hf_config, device: str):
    """A transformers model of this config, random weights drawn on the device: bfloat16 on a
    GPU, float32 on the CPU."""
    torch.set_default_dtype(torch.bfloat16 if device != "cpu" else torch.float32)
    try:
        with torch.device(device):
            return model_class(hf_config).eval()
    finally:
        torch.set_default_dtype(torch.float32)


def synthetic_prompt(vocab: int, n: int, seed: int, offset: int = 0) -> list[int]:
    """n deterministic token ids below vocab; different seeds give different prompts."""
    return [(seed * 7919 + i * 104729 + offset) % vocab for i in range(n)]


def id_tokenizer(vocab_size: int) -> Tokenizer:
    """A word-level tokenizer whose token i is the text `<i>`: enough to decode any id."""
    vocab = {f"<{i}>": i for i in range(vocab_size)}
    tk = HFTokenizer(models.WordLevel(vocab=vocab, unk_token="<0>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    return Tokenizer(tk, chat_template=None, bos_token=None, eos_token=None, eos_token_ids=set())


def random_checkpoint(
    config: ModelConfig, device: str, seed: int = 0, tokenizer: Tokenizer | None = None
) -> Checkpoint:
    """Weights drawn on `device`: N(0, 0.02) matrices (the usual init), unit norm weights."""
    shapes = expected_shapes(config)

    def load(name: str) -> torch.Tensor:
        # seeded by name: every engine built from this checkpoint gets the same weights
        gen = torch.Generator(device=device).manual_seed(seed * 2**32 + zlib.crc32(name.encode()))
        shape = shapes[name]
        if name.endswith("norm.weight"):
            return torch.ones(shape, device=device)
        return (
            torch.randn(
                shape,
                generator=gen,
                device=device,
                dtype=torch.bfloat16 if device != "cpu" else torch.float32,
            )
            * 0.02
        )

    return Checkpoint(
        config=config,
        shapes=shapes,
        load=load,
        tokenizer=tokenizer or id_tokenizer(config.vocab_size),
        source=f"random {device}",
        fingerprint=f"random-{seed}-{config.hidden_size}x{config.num_layers}",
    )


def random_packed_checkpoint(
    config: ModelConfig,
    device: str,
    bits: int = 4,
    group: int = 64,
    seed: int = 0,
    tokenizer: Tokenizer | None = None,
) -> Checkpoint:
    """random_checkpoint with every projection and the LM head held as MLX affine codes (as an
    mlx-community checkpoint holds them; the embedding and norms stay float): random codes, and
    per-group scales and biases that keep the weights within about ±0.03."""
    base = random_checkpoint(config, device, seed, tokenizer)
    dtype = torch.bfloat16 if device != "cpu" else torch.float32
    levels = 2**bits - 1

    def packed(name: str) -> PackedWeight | None:
        shape = base.shapes[name]
        if not (name.endswith("proj.weight") or name == "lm_head.weight") or shape[1] % group:
            return None
        out, inputs = shape
        gen = torch.Generator(device=device).manual_seed(seed * 2**32 + zlib.crc32(name.encode()))
        codes = torch.randint(
            -(2**31), 2**31 - 1, (out, inputs * bits // 32), generator=gen, device=device,
            dtype=torch.int32,
        )  # fmt: skip
        span = 0.04 + 0.02 * torch.rand((out, inputs // group), generator=gen, device=device)
        scales = (span / levels).to(dtype)
        return PackedWeight(codes, scales, (-span / 2).to(dtype), bits, group)

    return dataclasses.replace(
        base,
        packed=packed,
        source=f"random {bits}-bit {device}",
        fingerprint=f"{base.fingerprint}-q{bits}g{group}",
    )
