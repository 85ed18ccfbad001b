"""Weights kept as affine codes in memory (MLX 2/4/8-bit): [out, in] = scale * code + bias per
group of `group` inputs, codes packed into uint32 words least significant first.

The ops never see codes: `Ops.linear` dequantizes a packed weight in fixed tiles of OUT_TILE
output rows and runs its ordinary float linear on each tile, so a row's result still does not
depend on the batch (the tile shapes are a property of the weight, not of the call), and memory
holds the codes plus one float tile at a time. An embedding lookup dequantizes only the rows it
reads.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

OUT_TILE = 2048  # output rows dequantized at once


def dequantize(
    codes: torch.Tensor, scales: torch.Tensor, biases: torch.Tensor, bits: int, group: int
) -> torch.Tensor:
    """[out, in] in scales' dtype from uint32 codes [out, in * bits / 32] and per-group scales
    and biases [out, in / group]."""
    out = codes.shape[0]
    codes = _words(codes)
    if bits in (4, 8) and sys.byteorder == "little":
        # the words' bytes in memory order hold their codes least significant first: unpacked
        # as bytes (a quarter of the traffic of shifting int64 copies of every word; the CPU's
        # packed linears dequantize their tiles every step: 2.4x faster at 4 bits, 9x at 8)
        raw = codes.contiguous().view(torch.uint8)
        q = raw if bits == 8 else torch.stack([raw & 0xF, raw >> 4], dim=-1).reshape(out, -1)
    else:
        per_word = 32 // bits
        shifts = torch.arange(per_word, dtype=torch.int64, device=codes.device) * bits
        q = (codes.to(torch.int64)[..., None] >> shifts) & ((1 << bits) - 1)
    w = q.reshape(out, -1, group).float() * scales.float()[..., None] + biases.float()[..., None]
    return w.reshape(out, -1).to(scales.dtype)


def _words(codes: torch.Tensor) -> torch.Tensor:
    """The code words as int32 (the same bits): CUDA lacks uint32 kernels for indexing and
    conversions. Shifting a sign-extended word and masking still gives each code."""
    return codes.view(torch.int32) if codes.dtype == torch.uint32 else codes


@dataclass
class PackedWeight:
    codes: torch.Tensor  # uint32 [out, in * bits / 32]
    scales: torch.Tensor  # [out, in / group], the float dtype the weight dequantizes to
    biases: torch.Tensor
    bits: int
    group: int
    # what a kernel derives once per weight and reuses every call (the CPU kernel's checks and
    # arguments); never part of the weight's identity
    prepared: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.codes.shape[0], self.codes.shape[1] * 32 // self.bits)

    @property
    def dtype(self) -> torch.dtype:
        return self.scales.dtype

    @property
    def device(self) -> torch.device:
        return self.codes.device

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scales, self.biases))

    def to(self, device, dtype: torch.dtype) -> PackedWeight:
        """On `device`, dequantizing to `dtype` (the codes stay uint32)."""
        return PackedWeight(
            self.codes.to(device),
            self.scales.to(device=device, dtype=dtype),
            self.biases.to(device=device, dtype=dtype),
            self.bits,
            self.group,
        )

    def rows(self, start: int, end: int) -> torch.Tensor:
        """Output rows [start, end) as a float [end - start, in] tensor."""
        return dequantize(
            self.codes[start:end], self.scales[start:end], self.biases[start:end], self.bits,
            self.group,
        )  # fmt: skip

    def select(self, index: torch.Tensor) -> PackedWeight:
        """The output rows `index` selects, still codes (a drafter's LM head over a subset of
        the target's vocabulary)."""
        return PackedWeight(
            _words(self.codes)[index].view(self.codes.dtype).contiguous(),
            self.scales[index].contiguous(),
            self.biases[index].contiguous(),
            self.bits,
            self.group,
        )

    def __getitem__(self, index: torch.Tensor) -> torch.Tensor:
        """The float rows `index` selects (an embedding lookup), indexed as int32 words (found
        on the H200: a packed embedding's first lookup failed for want of a uint32 kernel)."""
        codes = _words(self.codes)[index]
        return dequantize(codes, self.scales[index], self.biases[index], self.bits, self.group)


def cat_packed(weights: Sequence[PackedWeight]) -> PackedWeight:
    """Weights stacked along their output rows (fused qkv, gate/up): same bits and group."""
    first = weights[0]
    if any(
        (w.bits, w.group, w.shape[1]) != (first.bits, first.group, first.shape[1]) for w in weights
    ):
        raise ValueError("fused packed weights need the same bits, group size and input width")
    return PackedWeight(
        torch.cat([w.codes for w in weights]).contiguous(),
        torch.cat([w.scales for w in weights]).contiguous(),
        torch.cat([w.biases for w in weights]).contiguous(),
        first.bits,
        first.group,
    )
