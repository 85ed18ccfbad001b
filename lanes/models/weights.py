"""Checkpoint names and shapes, checked key by key, and the fused weights the decoder runs on."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import torch

from lanes.config import ModelConfig
from lanes.packed import PackedWeight, cat_packed

# Buffers some checkpoints carry that lanes recomputes.
_IGNORED = re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq")


class WeightError(ValueError):
    """A checkpoint that does not fit the model: names the tensors at fault."""


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """HF tensor name -> shape, for every tensor the checkpoint must hold."""
    h, d = cfg.hidden_size, cfg.head_dim
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
        shapes[p + "self_attn.q_proj.weight"] = (cfg.q_size, h)
        shapes[p + "self_attn.k_proj.weight"] = (cfg.kv_size, h)
        shapes[p + "self_attn.v_proj.weight"] = (cfg.kv_size, h)
        shapes[p + "self_attn.o_proj.weight"] = (h, cfg.q_size)
        if cfg.qkv_bias:
            shapes[p + "self_attn.q_proj.bias"] = (cfg.q_size,)
            shapes[p + "self_attn.k_proj.bias"] = (cfg.kv_size,)
            shapes[p + "self_attn.v_proj.bias"] = (cfg.kv_size,)
        if cfg.qk_norm:
            shapes[p + "self_attn.q_norm.weight"] = (d,)
            shapes[p + "self_attn.k_norm.weight"] = (d,)
        if i in cfg.moe_layers:
            shapes[p + "mlp.gate.weight"] = (cfg.num_experts, h)  # the router
            for e in range(cfg.num_experts):
                x, m = f"{p}mlp.experts.{e}.", cfg.moe_intermediate_size
                shapes[x + "gate_proj.weight"] = (m, h)
                shapes[x + "up_proj.weight"] = (m, h)
                shapes[x + "down_proj.weight"] = (h, m)
            continue
        shapes[p + "mlp.gate_proj.weight"] = (cfg.intermediate_size, h)
        shapes[p + "mlp.up_proj.weight"] = (cfg.intermediate_size, h)
        shapes[p + "mlp.down_proj.weight"] = (h, cfg.intermediate_size)
    return shapes


def check_shapes(found: dict[str, tuple[int, ...]], cfg: ModelConfig) -> None:
    """Raise WeightError naming every missing, unexpected or mis-shaped tensor."""
    want = expected_shapes(cfg)
    found = {k: v for k, v in found.items() if not _IGNORED.fullmatch(k)}
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


def _more(names: list[str]) -> str:
    return f" (and {len(names) - 10} more)" if len(names) > 10 else ""


@dataclass
class LayerWeights:
    input_norm: torch.Tensor  # [hidden]
    qkv: torch.Tensor | PackedWeight  # [q_size + 2 * kv_size, hidden]
    qkv_bias: torch.Tensor | None
    q_norm: torch.Tensor | None  # [head_dim]
    k_norm: torch.Tensor | None
    o: torch.Tensor | PackedWeight  # [hidden, q_size]
    post_norm: torch.Tensor  # [hidden]
    gate_up: torch.Tensor | PackedWeight | None  # [2 * intermediate, hidden]; None: MoE layer
    down: torch.Tensor | PackedWeight | None  # [hidden, intermediate]
    router: torch.Tensor | None = None  # [experts, hidden] (mixture-of-experts layers)
    experts_gate_up: torch.Tensor | None = None  # [experts, 2 * moe_intermediate, hidden]
    experts_down: torch.Tensor | None = None  # [experts, hidden, moe_intermediate]


@dataclass
class DecoderWeights:
    embed: torch.Tensor | PackedWeight  # [vocab, hidden]
    layers: list[LayerWeights]
    norm: torch.Tensor  # [hidden]
    lm_head: torch.Tensor | PackedWeight  # [vocab, hidden]; the embedding itself when tied
    # EAGLE-style drafters: [hidden, 2 * hidden] mixes each row's token embedding with the
    # target's feature for that row (drafter/eagle.py); None for ordinary decoders
    fuse: torch.Tensor | None = None

    @property
    def nbytes(self) -> int:
        """Bytes the weights hold in memory (codes, scales and biases for packed ones)."""
        seen, total = set(), 0
        tensors = [self.embed, self.norm, self.lm_head, self.fuse]
        for layer in self.layers:
            tensors += list(vars(layer).values())
        for t in tensors:
            if t is None or id(t) in seen:
                continue
            seen.add(id(t))
            total += t.nbytes if isinstance(t, PackedWeight) else t.numel() * t.element_size()
        return total


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
        return t.to(device=device, dtype=dtype)

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
            "experts_gate_up": torch.stack(
                [dense(cat(x + "gate_proj.weight", x + "up_proj.weight")) for x in experts]
            ),
            "experts_down": torch.stack([dense(get(x + "down_proj.weight")) for x in experts]),
        }

    layers = []
    for i in range(cfg.num_layers):
        a, m = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        layers.append(
            LayerWeights(
                input_norm=get(f"model.layers.{i}.input_layernorm.weight"),
                qkv=cat(a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"),
                qkv_bias=cat(a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias")
                if cfg.qkv_bias
                else None,
                q_norm=get(a + "q_norm.weight") if cfg.qk_norm else None,
                k_norm=get(a + "k_norm.weight") if cfg.qk_norm else None,
                o=get(a + "o_proj.weight"),
                post_norm=get(f"model.layers.{i}.post_attention_layernorm.weight"),
                **mlp(m, i),
            )
        )
    embed = get("model.embed_tokens.weight")
    lm_head = embed if cfg.tie_word_embeddings else get("lm_head.weight")
    return DecoderWeights(
        embed=embed, layers=layers, norm=get("model.norm.weight"), lm_head=lm_head
    )
