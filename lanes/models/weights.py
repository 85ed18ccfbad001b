"""Checkpoint names and shapes, checked key by key, and the fused weights the decoder runs on."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import torch

from lanes.config import FULL_ATTENTION, LINEAR_ATTENTION, ModelConfig
from lanes.packed import PackedWeight, cat_packed

# Buffers some checkpoints carry that lanes recomputes.
_IGNORED = re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq")


class WeightError(ValueError):
    """A checkpoint that does not fit the model: names the tensors at fault."""


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """HF tensor name -> shape, for every tensor the checkpoint must hold."""
    if cfg.family == "nemotron_h":
        return _nemotron_h_shapes(cfg)
    h = cfg.hidden_size
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (cfg.vocab_size, h),
        "model.norm.weight": (h,),
    }
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, h)
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        if i in cfg.linear_layers:
            shapes.update(_deltanet_shapes(cfg, p + "linear_attn."))
        else:
            shapes.update(_attention_shapes(cfg, p + "self_attn."))
        shapes.update(_mlp_shapes(cfg, p + "mlp.", i in cfg.moe_layers))
    return shapes


def _attention_shapes(cfg: ModelConfig, p: str) -> dict[str, tuple[int, ...]]:
    h, d = cfg.hidden_size, cfg.head_dim
    gate = 2 if cfg.attn_output_gate else 1  # q_proj also projects the output gate
    shapes = {
        p + "q_proj.weight": (gate * cfg.q_size, h),
        p + "k_proj.weight": (cfg.kv_size, h),
        p + "v_proj.weight": (cfg.kv_size, h),
        p + "o_proj.weight": (h, cfg.q_size),
    }
    if cfg.qkv_bias:
        shapes[p + "q_proj.bias"] = (cfg.q_size,)
        shapes[p + "k_proj.bias"] = (cfg.kv_size,)
        shapes[p + "v_proj.bias"] = (cfg.kv_size,)
    if cfg.qk_norm:
        shapes[p + "q_norm.weight"] = (d,)
        shapes[p + "k_norm.weight"] = (d,)
    return shapes


def _mlp_shapes(cfg: ModelConfig, p: str, routed: bool) -> dict[str, tuple[int, ...]]:
    """A SiLU MLP, or a router with its experts (and Qwen3.5-MoE's gated shared expert)."""
    h = cfg.hidden_size

    def silu_mlp(x: str, m: int) -> dict[str, tuple[int, ...]]:
        return {x + "gate_proj.weight": (m, h), x + "up_proj.weight": (m, h),
                x + "down_proj.weight": (h, m)}  # fmt: skip

    if not routed:
        return silu_mlp(p, cfg.intermediate_size)
    shapes = {p + "gate.weight": (cfg.num_experts, h)}  # the router
    if cfg.router == "sigmoid_groups":  # GLM-4 MoE's per-expert correction of the choice
        shapes[p + "gate.e_score_correction_bias"] = (cfg.num_experts,)
    for e in range(cfg.num_experts):
        shapes.update(silu_mlp(f"{p}experts.{e}.", cfg.moe_intermediate_size))
    if cfg.shared_expert_intermediate_size and cfg.shared_expert_gated:
        shapes.update(silu_mlp(p + "shared_expert.", cfg.shared_expert_intermediate_size))
        shapes[p + "shared_expert_gate.weight"] = (1, h)
    elif cfg.shared_expert_intermediate_size:  # GLM-4 MoE: plural, no gate
        shapes.update(silu_mlp(p + "shared_experts.", cfg.shared_expert_intermediate_size))
    return shapes


def _deltanet_shapes(cfg: ModelConfig, p: str) -> dict[str, tuple[int, ...]]:
    """A gated DeltaNet layer's tensors, as transformers names them (Qwen3.5)."""
    h, hv = cfg.hidden_size, cfg.linear_num_value_heads
    key_dim = cfg.linear_num_key_heads * cfg.linear_key_head_dim
    value_dim = hv * cfg.linear_value_head_dim
    conv_dim = 2 * key_dim + value_dim
    return {
        p + "in_proj_qkv.weight": (conv_dim, h),
        p + "in_proj_z.weight": (value_dim, h),
        p + "in_proj_b.weight": (hv, h),
        p + "in_proj_a.weight": (hv, h),
        p + "conv1d.weight": (conv_dim, 1, cfg.linear_conv_kernel),
        p + "dt_bias": (hv,),
        p + "A_log": (hv,),
        p + "norm.weight": (cfg.linear_value_head_dim,),
        p + "out_proj.weight": (h, value_dim),
    }


def _nemotron_h_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Nemotron-H's tensors, as its checkpoints name them: a norm and one mixer per block."""
    h = cfg.hidden_size
    shapes: dict[str, tuple[int, ...]] = {
        "backbone.embeddings.weight": (cfg.vocab_size, h),
        "backbone.norm_f.weight": (h,),
    }
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, h)
    s = cfg.mamba
    for i, kind in enumerate(cfg.layer_types):
        p = f"backbone.layers.{i}."
        shapes[p + "norm.weight"] = (h,)
        p += "mixer."
        if kind == LINEAR_ATTENTION:
            shapes.update({
                p + "in_proj.weight": (2 * s.inner + 2 * s.groups * s.state + s.heads, h),
                p + "conv1d.weight": (s.conv_dim, 1, s.kernel),
                p + "dt_bias": (s.heads,), p + "A_log": (s.heads,), p + "D": (s.heads,),
                p + "norm.weight": (s.inner,),
                p + "out_proj.weight": (h, s.inner),
            })  # fmt: skip
            if s.conv_bias:
                shapes[p + "conv1d.bias"] = (s.conv_dim,)
        elif kind == FULL_ATTENTION:
            shapes.update(_attention_shapes(cfg, p))
        else:
            shapes[p + "up_proj.weight"] = (cfg.intermediate_size, h)
            shapes[p + "down_proj.weight"] = (h, cfg.intermediate_size)
    return shapes


def check_shapes(found: dict[str, tuple[int, ...]], cfg: ModelConfig) -> None:
    """Raise WeightError naming every missing, unexpected or mis-shaped tensor."""
    want = expected_shapes(cfg)
    found = {k: v for k, v in found.items() if not _IGNORED.fullmatch(k)}
    if cfg.family == "glm4_moe":  # its multi-token-prediction layers, after the decoder's own
        found = {k: v for k, v in found.items() if _layer_index(k) < cfg.num_layers}
    if cfg.tie_word_embeddings:
        found.pop("lm_head.weight", None)  # some tied checkpoints store the copy anyway
    problems = []
    missing = sorted(set(want) - set(found))
    unexpected = sorted(set(found) - set(want))
    wrong = sorted(k for k in set(want) & set(found) if tuple(found[k]) != want[k])
    if missing:
        problems.append("missing: " + ", ".join(missing[:10]) + _more(missing))
    if unexpected:
        problems.append("unexpected: " + ", ".join(unexpected[:10]) + _more(unexpected))
    for k in wrong[:10]:
        problems.append(f"{k} has shape {list(found[k])}, expected {list(want[k])}")
    if problems:
        raise WeightError("checkpoint does not match the model config: " + "; ".join(problems))


def _layer_index(name: str) -> int:
    """The decoder layer a tensor belongs to (-1: none)."""
    parts = name.split(".")
    if len(parts) > 2 and parts[:2] == ["model", "layers"] and parts[2].isdigit():
        return int(parts[2])
    return -1


def _more(names: list[str]) -> str:
    return f" (and {len(names) - 10} more)" if len(names) > 10 else ""


@dataclass
class DeltaNetWeights:
    """A gated DeltaNet token mixer (lanes/models/deltanet.py)."""

    in_proj: torch.Tensor  # [conv_dim + value_dim + 2 * v_heads, hidden]: qkv, z, b, a
    conv: torch.Tensor  # [conv_dim, kernel] depthwise causal conv over qkv
    neg_a: torch.Tensor  # [v_heads] float32: -exp(A_log), the decay rate
    dt_bias: torch.Tensor  # [v_heads] float32
    norm: torch.Tensor  # [value_head_dim]: the gated RMSNorm of each value head's output
    out: torch.Tensor  # [hidden, value_dim]


@dataclass
class Mamba2Weights:
    """A Mamba-2 token mixer (lanes/models/mamba2.py)."""

    in_proj: torch.Tensor  # [inner + conv_dim + heads, hidden]: z, xBC, dt
    conv: torch.Tensor  # [conv_dim, kernel] depthwise, oldest input first
    conv_bias: torch.Tensor | None  # [conv_dim]
    dt_bias: torch.Tensor  # [heads] float32
    neg_a: torch.Tensor  # [heads] float32: -exp(A_log)
    d: torch.Tensor  # [heads] float32: the skip
    norm: torch.Tensor  # [inner]: the gated group norm's weight
    out: torch.Tensor  # [hidden, inner]


@dataclass
class LayerWeights:
    input_norm: torch.Tensor  # [hidden]
    # attention layers: [q_size + 2 * kv_size (+ q_size of output gate), hidden]; None: DeltaNet
    qkv: torch.Tensor | PackedWeight | None
    qkv_bias: torch.Tensor | None
    q_norm: torch.Tensor | None  # [head_dim]
    k_norm: torch.Tensor | None
    o: torch.Tensor | PackedWeight | None  # [hidden, q_size]
    post_norm: torch.Tensor  # [hidden]
    gate_up: torch.Tensor | PackedWeight | None  # [2 * intermediate, hidden]; None: MoE layer
    down: torch.Tensor | PackedWeight | None  # [hidden, intermediate]
    router: torch.Tensor | None = None  # [experts, hidden] (mixture-of-experts layers)
    router_bias: torch.Tensor | None = None  # [experts] fp32: GLM-4 MoE's choice correction
    experts_gate_up: torch.Tensor | None = None  # [experts, 2 * moe_intermediate, hidden]
    experts_down: torch.Tensor | None = None  # [experts, hidden, moe_intermediate]
    deltanet: DeltaNetWeights | None = None  # linear-attention layers of hybrids
    mamba: Mamba2Weights | None = None  # Nemotron-H's linear-attention layers
    up: torch.Tensor | PackedWeight | None = None  # [intermediate, hidden]: an ungated ReLU² MLP
    # Qwen3.5-MoE's shared expert: [2 * shared_intermediate, hidden], [hidden, ...], [1, hidden]
    shared_gate_up: torch.Tensor | None = None
    shared_down: torch.Tensor | None = None
    shared_gate: torch.Tensor | None = None

    @property
    def has_mixer(self) -> bool:
        """False for Nemotron-H's MLP blocks."""
        return self.qkv is not None or self.deltanet is not None or self.mamba is not None

    @property
    def has_mlp(self) -> bool:
        """False for Nemotron-H's mixer blocks."""
        return self.gate_up is not None or self.router is not None or self.up is not None


@dataclass
class DecoderWeights:
    embed: torch.Tensor | PackedWeight  # [vocab, hidden]
    layers: list[LayerWeights]
    norm: torch.Tensor  # [hidden]
    lm_head: torch.Tensor | PackedWeight  # [vocab, hidden]; the embedding itself when tied
    # EAGLE-style drafters: [hidden, 2 * hidden] mixes each row's token embedding with the
    # target's feature for that row (drafter/eagle.py); None for ordinary decoders
    fuse: torch.Tensor | None = None
    # EAGLE-3 heads (drafter/eagle3_format.py): the first layer's attention reads
    # [input_norm(token embedding), hidden_norm(feature)], 2 * hidden wide, and the residual
    # stream starts at the feature itself (at its norm with `norm_before_residual`)
    hidden_norm: torch.Tensor | None = None
    norm_before_residual: bool = False

    @property
    def reads_features(self) -> bool:
        """A drafter's decoder: each row reads a target feature beside its token."""
        return self.fuse is not None or self.hidden_norm is not None

    def _distinct(self) -> list[torch.Tensor | PackedWeight]:
        """Every weight once (a tied LM head is the embedding)."""
        seen, out = set(), []
        tensors = [self.embed, self.norm, self.lm_head, self.fuse, self.hidden_norm]
        for layer in self.layers:
            mixers = (DeltaNetWeights, Mamba2Weights)
            tensors += [t for t in vars(layer).values() if not isinstance(t, mixers)]
            for mixer in (layer.deltanet, layer.mamba):
                if mixer is not None:
                    tensors += list(vars(mixer).values())
        for t in tensors:
            if t is not None and id(t) not in seen:
                seen.add(id(t))
                out.append(t)
        return out

    @property
    def nbytes(self) -> int:
        """Bytes the weights hold in memory (codes, scales and biases for packed ones)."""
        return sum(
            t.nbytes if isinstance(t, PackedWeight) else t.numel() * t.element_size()
            for t in self._distinct()
        )

    def packed_forms(self) -> dict[tuple[int, int], int]:
        """(bits, group size) -> how many weights are kept packed in that form."""
        forms: dict[tuple[int, int], int] = {}
        for t in self._distinct():
            if isinstance(t, PackedWeight):
                forms[(t.bits, t.group)] = forms.get((t.bits, t.group), 0) + 1
        return forms


def _own_memory(t: torch.Tensor) -> torch.Tensor:
    """t contiguous and 64-byte aligned, copied if the file's layout left it otherwise (a view
    into a memory-mapped shard at any offset): CPU BLAS kernels can round a weight's products
    differently at another alignment, and the same weights must give the same bits however the
    checkpoint was split (found by tests/test_loading.py)."""
    if t.is_contiguous() and t.data_ptr() % 64 == 0:
        return t
    return t.clone(memory_format=torch.contiguous_format)


def dense(weight: torch.Tensor | PackedWeight) -> torch.Tensor:
    """A float tensor of the weight (packed codes dequantized)."""
    return weight.rows(0, weight.shape[0]) if isinstance(weight, PackedWeight) else weight


def assemble(
    cfg: ModelConfig,
    load: Callable[[str], torch.Tensor],
    dtype: torch.dtype,
    device: torch.device | str,
    progress: Callable[[int], None] = lambda n: None,
    packed: Callable[[str], PackedWeight | None] | None = None,
) -> DecoderWeights:
    """Load every expected tensor through `load(name)`, check it, and fuse qkv and gate/up.
    With `packed` (a quantized checkpoint), its quantized weights stay codes (lanes.packed)."""

    def finite(name: str, t: torch.Tensor) -> None:
        if not torch.isfinite(t).all():
            raise WeightError(f"tensor {name} holds NaN or infinite values (corrupt checkpoint?)")

    def get(name: str) -> torch.Tensor | PackedWeight:
        codes = packed(name) if packed is not None else None
        if codes is not None:
            finite(name, codes.scales)
            finite(name, codes.biases)
            progress(1)
            return codes.to(device, dtype)
        t = load(name)
        if not t.is_floating_point():
            raise WeightError(f"tensor {name} has dtype {t.dtype}, expected a floating type")
        finite(name, t)
        progress(1)
        return _own_memory(t.to(device=device, dtype=dtype))

    def cat(*names: str) -> torch.Tensor | PackedWeight:
        parts = [get(n) for n in names]
        if all(isinstance(p, PackedWeight) for p in parts):
            return cat_packed(parts)
        return torch.cat([dense(p) for p in parts]).contiguous()

    def mlp(m: str, i: int) -> dict[str, torch.Tensor | None]:
        if i not in cfg.moe_layers:
            return {"gate_up": cat(m + "gate_proj.weight", m + "up_proj.weight"),
                    "down": get(m + "down_proj.weight")}  # fmt: skip
        experts = [f"{m}experts.{e}." for e in range(cfg.num_experts)]
        return {
            "gate_up": None,
            "down": None,
            "router": get(m + "gate.weight"),
            "router_bias": get_fp32(m + "gate.e_score_correction_bias")
            if cfg.router == "sigmoid_groups"
            else None,
            "experts_gate_up": torch.stack(
                [dense(cat(x + "gate_proj.weight", x + "up_proj.weight")) for x in experts]
            ),
            "experts_down": torch.stack([dense(get(x + "down_proj.weight")) for x in experts]),
            **shared(m),
        }

    def shared(m: str) -> dict[str, torch.Tensor | None]:
        if not cfg.shared_expert_intermediate_size:
            return {}
        if not cfg.shared_expert_gated:
            x = m + "shared_experts."
            return {"shared_gate_up": dense(cat(x + "gate_proj.weight", x + "up_proj.weight")),
                    "shared_down": dense(get(x + "down_proj.weight"))}  # fmt: skip
        x = m + "shared_expert."
        return {
            "shared_gate_up": dense(cat(x + "gate_proj.weight", x + "up_proj.weight")),
            "shared_down": dense(get(x + "down_proj.weight")),
            "shared_gate": dense(get(m + "shared_expert_gate.weight")),
        }

    def get_fp32(name: str) -> torch.Tensor:
        """A small tensor kept in float32 whatever the model dtype (norm offsets, decay rates)."""
        t = load(name)
        finite(name, t)
        progress(1)
        return t.to(device=device, dtype=torch.float32)

    def norm(name: str) -> torch.Tensor:
        if not cfg.zero_centred_norms:
            return get(name)
        return (1.0 + get_fp32(name)).to(dtype)  # stored as w, applied as 1 + w

    def attention(a: str) -> dict:
        if cfg.attn_output_gate:  # q_proj rows per head: [its q | its gate]
            q = dense(get(a + "q_proj.weight"))
            q = q.reshape(cfg.num_heads, 2, cfg.head_dim, -1).transpose(0, 1).reshape(q.shape)
            k, v = dense(get(a + "k_proj.weight")), dense(get(a + "v_proj.weight"))
            qkv = torch.cat(
                [q[: cfg.q_size], k, v, q[cfg.q_size :]]
            ).contiguous()  # [q; k; v; gate]
        else:
            qkv = cat(a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight")
        return {
            "qkv": qkv,
            "qkv_bias": cat(a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias")
            if cfg.qkv_bias
            else None,
            "q_norm": norm(a + "q_norm.weight") if cfg.qk_norm else None,
            "k_norm": norm(a + "k_norm.weight") if cfg.qk_norm else None,
            "o": get(a + "o_proj.weight"),
        }

    def deltanet(x: str) -> dict:
        projections = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")
        return {
            "qkv": None,
            "qkv_bias": None,
            "q_norm": None,
            "k_norm": None,
            "o": None,
            "deltanet": DeltaNetWeights(
                in_proj=torch.cat([dense(get(f"{x}{p}.weight")) for p in projections]),
                conv=get(x + "conv1d.weight")[:, 0].contiguous(),
                neg_a=-get_fp32(x + "A_log").exp(),
                dt_bias=get_fp32(x + "dt_bias"),
                norm=get(x + "norm.weight"),
                out=get(x + "out_proj.weight"),
            ),
        }

    def mamba(x: str) -> Mamba2Weights:
        return Mamba2Weights(
            in_proj=dense(get(x + "in_proj.weight")),
            conv=get(x + "conv1d.weight")[:, 0].contiguous(),
            conv_bias=get_fp32(x + "conv1d.bias") if cfg.mamba.conv_bias else None,
            dt_bias=get_fp32(x + "dt_bias"),
            neg_a=-get_fp32(x + "A_log").exp(),
            d=get_fp32(x + "D"),
            norm=get(x + "norm.weight"),
            out=get(x + "out_proj.weight"),
        )

    def nemotron_block(i: int, kind: str) -> LayerWeights:
        """One pre-normed block holding one mixer; its norm serves as both of the layer's norms
        (the decoder runs only the half the block has)."""
        p = f"backbone.layers.{i}."
        block_norm = norm(p + "norm.weight")
        parts: dict = {"qkv": None, "qkv_bias": None, "q_norm": None, "k_norm": None, "o": None}
        if kind == LINEAR_ATTENTION:
            parts["mamba"] = mamba(p + "mixer.")
        elif kind == FULL_ATTENTION:
            parts.update(attention(p + "mixer."))
        else:  # the ReLU² MLP
            parts["up"] = get(p + "mixer.up_proj.weight")
            parts["down"] = get(p + "mixer.down_proj.weight")
        return LayerWeights(
            input_norm=block_norm,
            post_norm=block_norm,
            **{"gate_up": None, "down": None, **parts},
        )

    if cfg.family == "nemotron_h":
        embed = get("backbone.embeddings.weight")
        blocks = [nemotron_block(i, kind) for i, kind in enumerate(cfg.layer_types)]
        return DecoderWeights(
            embed=embed,
            layers=blocks,
            norm=norm("backbone.norm_f.weight"),
            lm_head=embed if cfg.tie_word_embeddings else get("lm_head.weight"),
        )
    layers = []
    for i in range(cfg.num_layers):
        p, m = f"model.layers.{i}.", f"model.layers.{i}.mlp."
        mixer = (
            deltanet(p + "linear_attn.") if i in cfg.linear_layers else attention(p + "self_attn.")
        )
        layers.append(
            LayerWeights(
                input_norm=norm(p + "input_layernorm.weight"),
                post_norm=norm(p + "post_attention_layernorm.weight"),
                **mixer,
                **mlp(m, i),
            )
        )
    embed = get("model.embed_tokens.weight")
    lm_head = embed if cfg.tie_word_embeddings else get("lm_head.weight")
    return DecoderWeights(
        embed=embed, layers=layers, norm=norm("model.norm.weight"), lm_head=lm_head
    )
