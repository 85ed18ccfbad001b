"""Each family's own config fields, read from a transformers `config.json` dict: experts and
their routing (Qwen3-MoE, Qwen3.5-MoE, GLM-4 MoE), hybrid layer layouts (Qwen3.5's gated
DeltaNet, Nemotron-H's Mamba-2 blocks). What a family does not use is never required.
ModelConfig.from_hf (lanes/config.py, which re-exports the names here) reads the fields every
family has and calls these; both raise ConfigError."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LINEAR_ATTENTION, FULL_ATTENTION = "linear_attention", "full_attention"
MLP_BLOCK = "mlp"  # Nemotron-H: a block that is only an MLP (no token mixer)


class ConfigError(ValueError):
    """A model or engine configuration lanes cannot run."""


@dataclass(frozen=True)
class Mamba2Shape:
    """A Mamba-2 mixer's head layout (Nemotron-H's linear-attention layers)."""

    heads: int  # mamba_num_heads
    head_dim: int  # mamba_head_dim
    state: int  # ssm_state_size
    groups: int  # n_groups: heads share B and C within a group
    kernel: int  # conv_kernel
    eps: float  # the gated norm's
    dt_min: float = 0.0  # time_step_limit
    dt_max: float = float("inf")
    conv_bias: bool = True

    @property
    def inner(self) -> int:
        return self.heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        return self.inner + 2 * self.groups * self.state


def number_field(raw: dict[str, Any], name: str, kind: type, default: Any = None) -> Any:
    """A numeric config field, or a ConfigError naming it (missing, wrong type)."""
    value = raw.get(name, default)
    if value is None and default is None:
        raise ConfigError(f"'{name}' is missing")
    if value is None:
        return default
    ok = isinstance(value, int) if kind is int else isinstance(value, int | float)
    if not ok or isinstance(value, bool):
        raise ConfigError(
            f"'{name}' must be {'an integer' if kind is int else 'a number'}, got {value!r:.40}"
        )
    return kind(value)


def family_fields(raw: dict[str, Any], family: str, head_dim: int) -> dict[str, Any]:
    """The fields only some families have: experts, hybrid layers, a shared expert."""
    fields: dict[str, Any] = {}
    if family in ("qwen3_moe", "qwen3_5_moe"):
        fields.update(_moe_fields(raw))
    if family in ("qwen3_5", "qwen3_5_moe"):
        fields.update(_hybrid_fields(raw, head_dim))
    if family == "qwen3_5_moe":
        fields.update(_shared_expert_fields(raw))
    if family == "glm4_moe":
        fields.update(_glm_moe_fields(raw, head_dim))
    if family == "nemotron_h":
        fields.update(_nemotron_h_fields(raw))
    return fields


# Nemotron-H's block letters (`hybrid_override_pattern`) and the names transformers' configs use
_NEMOTRON_BLOCKS = {
    "M": LINEAR_ATTENTION, "linear_attention": LINEAR_ATTENTION, "mamba": LINEAR_ATTENTION,
    "*": FULL_ATTENTION, "full_attention": FULL_ATTENTION, "attention": FULL_ATTENTION,
    "-": MLP_BLOCK, "mlp": MLP_BLOCK,
    "E": "moe", "moe": "moe",
}  # fmt: skip


def _nemotron_h_blocks(raw: dict[str, Any]) -> list[str]:
    """Each block's type from `layers_block_type` (transformers 5), else the older
    `hybrid_override_pattern` string (hub checkpoints: "M-M*-..."); MoE blocks are refused."""
    blocks = raw.get("layers_block_type") or raw.get("layer_types")
    if blocks is None:
        blocks = raw.get("hybrid_override_pattern")
        if not isinstance(blocks, str):
            raise ConfigError("'hybrid_override_pattern' (or 'layers_block_type') is missing")
        blocks = list(blocks)
    if not isinstance(blocks, list) or not blocks:
        raise ConfigError(f"'layers_block_type' must list the blocks, got {blocks!r:.60}")
    unknown = sorted({b for b in blocks if b not in _NEMOTRON_BLOCKS}, key=str)
    if unknown:
        raise ConfigError(f"Nemotron-H block types {unknown!r:.60} are unknown")
    types = [_NEMOTRON_BLOCKS[b] for b in blocks]
    if "moe" in types:
        raise ConfigError(
            "Nemotron-H MoE blocks ('E') are not supported yet; lanes serves Nemotron-H's "
            "Mamba-2 ('M'), attention ('*') and MLP ('-') blocks"
        )
    return types


def nemotron_h_common(raw: dict[str, Any]) -> dict[str, Any]:
    """The config with the common fields under the names from_hf reads: the layer count from
    the block list, the norms' epsilon, and no attention bias (transformers builds none)."""
    return {
        **raw,
        "num_hidden_layers": len(_nemotron_h_blocks(raw)),
        "rms_norm_eps": raw.get("layer_norm_epsilon", 1e-5),
        "attention_bias": False,
    }


def _nemotron_h_fields(raw: dict[str, Any]) -> dict[str, Any]:
    """Nemotron-H: the block list, the Mamba-2 shape, ReLU² MLPs, attention without RoPE."""

    def either(name: str, legacy: str, kind: type, default: Any = None) -> Any:
        return number_field(raw, name if name in raw else legacy, kind, default)

    for key, want in (("mamba_hidden_act", "silu"), ("mlp_hidden_act", "relu2")):
        if raw.get(key, want) != want:
            raise ConfigError(f"'{key}' must be {want!r}, got {raw.get(key)!r:.40}")
    for key in ("use_bias", "mlp_bias", "mamba_proj_bias"):
        if raw.get(key):
            raise ConfigError(f"'{key}': Nemotron-H projections with biases are not supported")
    limit = raw.get("time_step_limit", raw.get("mamba_dt_limit", (0.0, float("inf"))))
    if not isinstance(limit, list | tuple) or len(limit) != 2:
        raise ConfigError(f"'time_step_limit' must be [min, max], got {limit!r:.60}")
    # transformers writes an infinite bound as {"__float__": "Infinity"}
    lo, hi = (float(v["__float__"]) if isinstance(v, dict) else v for v in limit)
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (lo, hi)):
        raise ConfigError(f"'time_step_limit' must be two numbers, got {limit!r:.60}")
    shape = Mamba2Shape(
        heads=number_field(raw, "mamba_num_heads", int),
        head_dim=number_field(raw, "mamba_head_dim", int),
        state=number_field(raw, "ssm_state_size", int),
        groups=either("n_groups", "mamba_n_groups", int, 8),
        kernel=either("conv_kernel", "mamba_d_conv", int, 4),
        eps=number_field(raw, "layer_norm_epsilon", float, 1e-5),
        dt_min=float(lo),
        dt_max=float(hi),
        conv_bias=bool(raw.get("use_conv_bias", raw.get("mamba_conv_bias", True))),
    )
    for name in ("heads", "head_dim", "state", "groups"):
        if getattr(shape, name) <= 0:
            raise ConfigError(f"the Mamba-2 {name} must be positive, got {getattr(shape, name)}")
    if shape.heads % shape.groups:
        raise ConfigError(
            f"'mamba_num_heads' ({shape.heads}) must be a multiple of 'n_groups' ({shape.groups})"
        )
    if not 2 <= shape.kernel <= 64:
        raise ConfigError(f"'conv_kernel' must be in [2, 64], got {shape.kernel}")
    if shape.inner > 2**18 or shape.state > 2**12:  # a lying config must not allocate GiBs
        raise ConfigError(
            f"a Mamba-2 mixer of {shape.inner} channels and state {shape.state} is beyond what "
            f"lanes takes ({2**18}, {2**12})"
        )
    return {
        "layer_types": tuple(_nemotron_h_blocks(raw)),
        "mamba": shape,
        "mlp_activation": "relu2",
        "attention_rope": False,
    }


def _glm_moe_fields(raw: dict[str, Any], head_dim: int) -> dict[str, Any]:
    """GLM-4 MoE: layers from `first_k_dense_replace` on route to experts; a shared expert of
    n_shared_experts x moe_intermediate_size; partial RoPE (half the head by default)."""
    layers = number_field(raw, "num_hidden_layers", int)
    key = "n_routed_experts" if "n_routed_experts" in raw else "num_local_experts"
    experts = number_field(raw, key, int)
    groups = number_field(raw, "n_group", int, 1)
    topk_group = number_field(raw, "topk_group", int, 1)
    if experts <= 0 or groups <= 0 or experts % groups or not 0 < topk_group <= groups:
        raise ConfigError(
            f"GLM-4 MoE routing: {experts} experts in {groups} groups, topk_group {topk_group}"
        )
    if experts // groups < 2:
        raise ConfigError("GLM-4 MoE routing needs at least 2 experts per group")
    params = raw.get("rope_parameters") or {}
    factor = number_field({**params, **raw}, "partial_rotary_factor", float, 0.5)
    rotary = int(head_dim * factor)
    if not 0 < rotary <= head_dim or rotary % 2:
        raise ConfigError(f"'partial_rotary_factor' {factor} gives {rotary} rotary dims")
    size = number_field(raw, "moe_intermediate_size", int)
    return {
        "num_experts": experts,
        "experts_per_token": number_field(raw, "num_experts_per_tok", int),
        "moe_intermediate_size": size,
        "norm_topk_prob": bool(raw.get("norm_topk_prob", True)),
        "moe_layers": tuple(range(number_field(raw, "first_k_dense_replace", int, 1), layers)),
        "shared_expert_intermediate_size": size * number_field(raw, "n_shared_experts", int, 1),
        "shared_expert_gated": False,
        "router": "sigmoid_groups",
        "n_group": groups,
        "topk_group": topk_group,
        "routed_scaling_factor": number_field(raw, "routed_scaling_factor", float, 1.0),
        "rotary_dim": rotary,
    }


def _shared_expert_fields(raw: dict[str, Any]) -> dict[str, Any]:
    """Qwen3.5-MoE: a shared expert beside the routed ones; the router always renormalises."""
    size = number_field(raw, "shared_expert_intermediate_size", int, 0)
    if size < 0:
        raise ConfigError(f"'shared_expert_intermediate_size' must be >= 0, got {size}")
    return {"shared_expert_intermediate_size": size, "norm_topk_prob": True}


def _hybrid_fields(raw: dict[str, Any], head_dim: int) -> dict[str, Any]:
    """Qwen3.5: `layer_types`, the DeltaNet layers' shapes, partial RoPE, gated attention."""
    num_layers = number_field(raw, "num_hidden_layers", int)
    types = raw.get("layer_types")
    if types is None:  # transformers' default: every `full_attention_interval`-th layer attends
        every = number_field(raw, "full_attention_interval", int, 4)
        types = [
            FULL_ATTENTION if (i + 1) % every == 0 else LINEAR_ATTENTION for i in range(num_layers)
        ]
    if not isinstance(types, list) or len(types) != num_layers:
        raise ConfigError(
            f"'layer_types' must list one type per layer ({num_layers}), got {types!r:.60}"
        )
    unknown = sorted({t for t in types if t not in (LINEAR_ATTENTION, FULL_ATTENTION)}, key=str)
    if unknown:
        raise ConfigError(
            f"'layer_types' names {unknown!r:.60}; lanes supports {LINEAR_ATTENTION!r} and "
            f"{FULL_ATTENTION!r}"
        )
    if raw.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"'hidden_act' must be 'silu', got {raw.get('hidden_act')!r:.40}")
    params = raw.get("rope_parameters") or {}
    factor = number_field({**params, **raw}, "partial_rotary_factor", float, 0.25)
    rotary = int(head_dim * factor)
    if not 0 < rotary <= head_dim or rotary % 2:
        raise ConfigError(
            f"'partial_rotary_factor' {factor} gives {rotary} rotary dims of {head_dim}"
        )
    fields = {
        "layer_types": tuple(types),
        "rotary_dim": rotary,
        "attn_output_gate": bool(raw.get("attn_output_gate", True)),
        "zero_centred_norms": True,
    }
    for name, key in (
        ("linear_num_key_heads", "linear_num_key_heads"),
        ("linear_num_value_heads", "linear_num_value_heads"),
        ("linear_key_head_dim", "linear_key_head_dim"),
        ("linear_value_head_dim", "linear_value_head_dim"),
        ("linear_conv_kernel", "linear_conv_kernel_dim"),
    ):
        fields[name] = number_field(raw, key, int)
        if fields[name] <= 0:
            raise ConfigError(f"'{key}' must be positive, got {fields[name]}")
    if fields["linear_num_value_heads"] % fields["linear_num_key_heads"]:
        raise ConfigError(
            "'linear_num_value_heads' must be a multiple of 'linear_num_key_heads', got "
            f"{fields['linear_num_value_heads']} and {fields['linear_num_key_heads']}"
        )
    return fields


def _moe_fields(raw: dict[str, Any]) -> dict[str, Any]:
    """Qwen3-MoE: layer i routes its tokens to experts unless it is in `mlp_only_layers` or
    (i + 1) is not a multiple of `decoder_sparse_step` (those keep a dense MLP)."""
    num_layers = number_field(raw, "num_hidden_layers", int)
    step = number_field(raw, "decoder_sparse_step", int, 1)
    if step <= 0:
        raise ConfigError(f"'decoder_sparse_step' must be positive, got {step}")
    dense = raw.get("mlp_only_layers") or []
    if not isinstance(dense, list) or not all(isinstance(i, int) for i in dense):
        raise ConfigError(f"'mlp_only_layers' must be a list of layer indices, got {dense!r:.40}")
    # hub checkpoints say num_experts; transformers 5 writes num_local_experts
    key = "num_experts" if "num_experts" in raw else "num_local_experts"
    experts = number_field(raw, key, int) if key in raw else number_field(raw, "num_experts", int)
    return {
        "num_experts": experts,
        "experts_per_token": number_field(raw, "num_experts_per_tok", int),
        "moe_intermediate_size": number_field(raw, "moe_intermediate_size", int),
        "norm_topk_prob": bool(raw.get("norm_topk_prob", False)),
        "moe_layers": tuple(
            i for i in range(num_layers) if i not in dense and experts > 0 and (i + 1) % step == 0
        ),
    }
