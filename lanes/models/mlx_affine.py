"""MLX affine-quantized checkpoints (what `mlx_lm.convert -q` writes, the mlx-community format).

config.json's `quantization` (or `quantization_config`) gives `group_size`, `bits` and `mode:
affine`, with optional per-module entries (a dict of its own, or false for a float module). A
quantized module W is stored as `W.weight` (uint32 [out, in * bits / 32], codes packed least
significant first), `W.scales` and `W.biases` ([out, in / group_size]); each weight is
scale * code + bias over its group of `group_size` inputs. Modules without `.scales` are float.

The decoder keeps quantized weights as their codes (lanes.packed, `Checkpoint.packed`); whatever
asks the checkpoint for a tensor by name (a drafter sharing the embedding, the distill teacher)
gets it dequantized to the checkpoint's float dtype.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch

from lanes.config import ConfigError
from lanes.models.weights import WeightError, dense
from lanes.packed import PackedWeight

BITS = (2, 4, 8)  # the widths whose codes never straddle two uint32 words


def quantization(raw: dict[str, Any]) -> dict[str, Any] | None:
    """The checkpoint's MLX quantization settings, or None for a float checkpoint."""
    q = raw.get("quantization") or raw.get("quantization_config")
    if isinstance(q, dict) and q.get("quant_method") is not None:  # GPTQ, AWQ, fp8, ...
        raise ConfigError(
            f"quantization method {q['quant_method']!r} is not supported (lanes reads MLX "
            "affine checkpoints and float ones)"
        )
    if not isinstance(q, dict) or "bits" not in q or "group_size" not in q:
        return None  # a float checkpoint
    mode = q.get("mode", "affine")
    if mode != "affine":
        raise ConfigError(f"quantization mode {mode!r} is not supported (lanes reads 'affine')")
    return q


def _settings(q: dict[str, Any], module: str) -> tuple[int, int]:
    own = q.get(module)
    bits = own.get("bits", q["bits"]) if isinstance(own, dict) else q["bits"]
    group = own.get("group_size", q["group_size"]) if isinstance(own, dict) else q["group_size"]
    if bits not in BITS or isinstance(bits, bool):
        raise ConfigError(f"quantization bits {bits!r} of {module}: lanes reads {BITS}")
    if not isinstance(group, int) or isinstance(group, bool) or group <= 0:
        raise ConfigError(f"quantization group_size {group!r} of {module} must be positive")
    return bits, group


_SWITCH = re.compile(
    r"(.*\.mlp\.)switch_mlp\.(gate_proj|up_proj|down_proj)\.(weight|scales|biases)"
)


def unstack_experts(
    q: dict[str, Any] | None,
    shapes: dict[str, tuple[int, ...]],
    load: Callable[[str], torch.Tensor],
) -> tuple[dict[str, Any] | None, dict[str, tuple[int, ...]], Callable[[str], torch.Tensor]]:
    """mlx-lm stores a MoE layer's experts stacked (`mlp.switch_mlp.gate_proj.weight` [experts,
    out, in], its scales and biases too); the per-expert names Hugging Face checkpoints use
    (`mlp.experts.{e}.gate_proj.weight`) read expert e's slice. A per-module quantization entry
    of the stacked module applies to each expert."""
    stacked = {}
    view = {}
    for name, shape in shapes.items():
        m = _SWITCH.fullmatch(name)
        if m is None or len(shape) < 2:
            view[name] = shape
            continue
        prefix, proj, part = m.groups()
        for e in range(shape[0]):
            view[f"{prefix}experts.{e}.{proj}.{part}"] = tuple(shape[1:])
            stacked[f"{prefix}experts.{e}.{proj}.{part}"] = (name, e)
    if not stacked:
        return q, shapes, load
    if q is not None:
        q = dict(q)
        for logical, (name, _) in stacked.items():
            module = name.rsplit(".", 1)[0]
            if module in q:
                q.setdefault(logical.rsplit(".", 1)[0], q[module])
    last: dict[str, torch.Tensor] = {}  # the stacked tensor read last: experts read in turn

    def load_expert(name: str) -> torch.Tensor:
        if name not in stacked:
            return load(name)
        source, e = stacked[name]
        if source not in last:
            last.clear()
            last[source] = load(source)
        return last[source][e].contiguous()

    return q, view, load_expert


def packed_view(
    q: dict[str, Any],
    shapes: dict[str, tuple[int, ...]],
    load: Callable[[str], torch.Tensor],
) -> tuple[
    dict[str, tuple[int, ...]],
    Callable[[str], torch.Tensor],
    Callable[[str], PackedWeight | None],
]:
    """The checkpoint's logical view: float shapes for the quantized modules' weights (their
    scales and biases no longer listed), a loader that gives float tensors (dequantized, for
    whatever needs floats), and `packed(name)`: a quantized weight as its codes (None for float
    tensors), which the decoder keeps."""
    modules = {n[: -len(".scales")] for n in shapes if n.endswith(".scales")}
    settings = {}
    view = dict(shapes)
    for m in sorted(modules):
        bits, group = _settings(q, m)
        names = [f"{m}.weight", f"{m}.scales", f"{m}.biases"]
        if any(n not in shapes for n in names):
            raise WeightError(f"{m}: a quantized module needs .weight, .scales and .biases")
        (out, words), scales = shapes[names[0]], shapes[names[1]]
        inputs = words * 32 // bits
        if inputs % group or tuple(scales) != (out, inputs // group) or shapes[names[2]] != scales:
            raise WeightError(
                f"{m}: packed weight [{out}, {words}] at {bits} bits is [{out}, {inputs}], which "
                f"needs scales and biases [{out}, {inputs // group}] for group_size {group}; "
                f"found {list(scales)} and {list(shapes[names[2]])}"
            )
        view[names[0]] = (out, inputs)
        del view[names[1]], view[names[2]]
        settings[names[0]] = (m, bits, group)

    def packed(name: str) -> PackedWeight | None:
        if name not in settings:
            return None
        m, bits, group = settings[name]
        codes = load(name)
        if codes.dtype not in (torch.uint32, torch.int32):
            raise WeightError(f"{name} has dtype {codes.dtype}, expected packed uint32 codes")
        return PackedWeight(codes, load(f"{m}.scales"), load(f"{m}.biases"), bits, group)

    def load_float(name: str) -> torch.Tensor:
        weight = packed(name)
        return load(name) if weight is None else dense(weight)

    return view, load_float, packed
