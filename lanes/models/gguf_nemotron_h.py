"""Nemotron-H in GGUF, as llama.cpp's converter writes it (architecture `nemotron_h`): tensor
names back to the checkpoint's `backbone.*` names (tables gguf_file reads), the tensors the
converter reshapes back to their checkpoint layout, and the block list and Mamba-2 shape from
the metadata as an HF config dict (so one parser, lanes.config, checks every Nemotron-H config).

What the converter changes, undone here:
  ssm_a            A = -exp(A_log), [heads, 1]      -> A_log = log(-A), [heads]
  ssm_d            D, [heads, 1]                    -> [heads]
  ssm_conv1d       [conv_dim, kernel] (squeezed)    -> [conv_dim, 1, kernel]
  ssm_norm         [groups, inner / groups]         -> [inner]
  ssm_dt.bias      the checkpoint's `dt_bias`
The block kinds are not named in the metadata: a block with KV heads is attention, one with a
feed-forward length an MLP, one with neither a Mamba-2 mixer (llama.cpp reads them so too)."""

from __future__ import annotations

from typing import Any

import numpy as np

from lanes.config import ConfigError

ARCH = "nemotron_h"

# GGUF name -> the checkpoint's (blocks under backbone.layers.N)
GLOBAL_NAMES = {
    "token_embd.weight": "backbone.embeddings.weight",
    "output_norm.weight": "backbone.norm_f.weight",
    "output.weight": "lm_head.weight",
}
BLOCK_NAMES = {
    "attn_norm.weight": "norm.weight",
    "ssm_in.weight": "mixer.in_proj.weight",
    "ssm_conv1d.weight": "mixer.conv1d.weight",
    "ssm_conv1d.bias": "mixer.conv1d.bias",
    "ssm_dt.bias": "mixer.dt_bias",
    "ssm_a": "mixer.A_log",
    "ssm_d": "mixer.D",
    "ssm_norm.weight": "mixer.norm.weight",
    "ssm_out.weight": "mixer.out_proj.weight",
    "attn_q.weight": "mixer.q_proj.weight",
    "attn_k.weight": "mixer.k_proj.weight",
    "attn_v.weight": "mixer.v_proj.weight",
    "attn_output.weight": "mixer.o_proj.weight",
    "ffn_up.weight": "mixer.up_proj.weight",
    "ffn_down.weight": "mixer.down_proj.weight",
}
BLOCK_PREFIX = "backbone.layers"


# the tensors the converter reshaped: their checkpoint shape from the file's (numpy order)
_RESHAPED = {
    ".mixer.A_log": lambda shape: (int(np.prod(shape)),),
    ".mixer.D": lambda shape: (int(np.prod(shape)),),
    ".mixer.norm.weight": lambda shape: (int(np.prod(shape)),),
    ".mixer.conv1d.weight": lambda shape: (shape[0], 1, *shape[1:]),
}


def hf_shape(name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The checkpoint's shape of a tensor the file holds in `shape` (numpy order)."""
    for suffix, reshaped in _RESHAPED.items():
        if name.endswith(suffix):
            return reshaped(shape)
    return shape


def hf_layout(name: str, data: np.ndarray) -> np.ndarray:
    """A tensor as the file holds it (float32) -> as the checkpoint holds it."""
    if name.endswith(".mixer.A_log"):
        if (data >= 0).any():  # -exp(A_log) is negative; log of anything else is no weight
            raise ConfigError(f"{name}: ssm_a must be negative (A = -exp(A_log))")
        data = np.log(-data)
    return data.reshape(hf_shape(name, data.shape))


def hf_config(fields: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    """The metadata as the config.json lanes.config reads for Nemotron-H."""

    def get(key: str, default: Any = None) -> Any:
        value = fields.get(f"{ARCH}.{key}", default)
        if value is None:
            raise ConfigError(f"GGUF metadata {ARCH}.{key} is missing")
        return value

    layers = int(get("block_count"))

    def per_layer(key: str) -> list[int]:
        value = get(key)
        values = list(value) if isinstance(value, list | tuple) else [value] * layers
        if len(values) != layers:
            raise ConfigError(
                f"GGUF metadata {ARCH}.{key} has {len(values)} entries for {layers} blocks"
            )
        return [int(v) for v in values]

    kv_heads, ff = per_layer("attention.head_count_kv"), per_layer("feed_forward_length")
    blocks = []
    for i, (kv, width) in enumerate(zip(kv_heads, ff, strict=True)):
        if kv and width:
            raise ConfigError(
                f"GGUF block {i} has both KV heads and a feed-forward length; a Nemotron-H "
                "block holds one mixer"
            )
        blocks.append("attention" if kv else "mlp" if width else "mamba")
    heads, inner = int(get("ssm.time_step_rank")), int(get("ssm.inner_size"))
    if heads <= 0 or inner % heads:
        raise ConfigError(
            f"GGUF metadata {ARCH}.ssm.inner_size ({inner}) must be a positive multiple of "
            f"ssm.time_step_rank ({heads}, the Mamba-2 head count)"
        )
    embed = shapes.get("backbone.embeddings.weight")
    if embed is None:
        raise ConfigError("GGUF tensor token_embd.weight is missing")
    eos = fields.get("tokenizer.ggml.eos_token_id")
    return {
        "architectures": ["NemotronHForCausalLM"],
        "layers_block_type": blocks,
        # the converter pads the token list; the embedding has the model's own vocabulary
        "vocab_size": embed[0],
        "hidden_size": int(get("embedding_length")),
        "intermediate_size": max(ff),
        "num_attention_heads": int(get("attention.head_count")),
        "num_key_value_heads": max(kv_heads) or int(get("attention.head_count")),
        "head_dim": int(get("attention.key_length")),
        "layer_norm_epsilon": float(get("attention.layer_norm_rms_epsilon", 1e-5)),
        "max_position_embeddings": int(get("context_length", 2048)),
        "tie_word_embeddings": "lm_head.weight" not in shapes,
        "mamba_num_heads": heads,
        "mamba_head_dim": inner // heads,
        "ssm_state_size": int(get("ssm.state_size")),
        "n_groups": int(get("ssm.group_count")),
        "conv_kernel": int(get("ssm.conv_kernel")),
        "use_conv_bias": any(n.endswith(".mixer.conv1d.bias") for n in shapes),
        "bos_token_id": fields.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": int(eos) if eos is not None else None,
    }
