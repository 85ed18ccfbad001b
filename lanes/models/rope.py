"""RoPE tables: inverse frequencies (plain or llama3-scaled) and cos/sin per absolute position."""

from __future__ import annotations

import math

import torch

from lanes.config import ModelConfig, RopeScaling


def inverse_frequencies(head_dim: int, theta: float, scaling: RopeScaling | None) -> torch.Tensor:
    """[head_dim / 2] float32."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (theta**exponents)
    if scaling is None:
        return inv_freq
    # llama3: long wavelengths are slowed by `factor`, short ones kept, the band between blended.
    old_len = scaling.original_max_position_embeddings
    wavelen = 2 * math.pi / inv_freq
    long_wavelen = old_len / scaling.low_freq_factor
    short_wavelen = old_len / scaling.high_freq_factor
    slowed = torch.where(wavelen > long_wavelen, inv_freq / scaling.factor, inv_freq)
    blend = (old_len / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    blended = (1 - blend) * slowed / scaling.factor + blend * slowed
    in_band = (wavelen >= short_wavelen) & (wavelen <= long_wavelen)
    return torch.where(in_band, blended, slowed)


def rope_tables(cfg: ModelConfig, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [max_position_embeddings, rope_dim / 2] float32, indexed by absolute position
    (rope_dim: head_dim, or the rotary part of it under partial RoPE). A model whose attention
    has no positional rotation (Nemotron-H) gets cos 1 and sin 0: the rotation leaves q and k
    as they are, exactly (x * 1 + y * 0)."""
    inv_freq = inverse_frequencies(cfg.rope_dim, cfg.rope_theta, cfg.rope_scaling)
    if not cfg.attention_rope:
        inv_freq = torch.zeros_like(inv_freq)
    positions = torch.arange(cfg.max_position_embeddings, dtype=torch.float32)
    angles = torch.outer(positions, inv_freq)
    return angles.cos().to(device), angles.sin().to(device)
