"""What a hybrid model's recurrent layers keep per lane, whichever mixer they are (a gated
DeltaNet or a Mamba-2 mixer): the two state shapes of cache/state_pool.py, and the widths of
the per-row inputs a verify step saves for the settle that follows it (CUDA graphs give them
static buffers, lanes/graphs.py)."""

from __future__ import annotations

from dataclasses import dataclass

from lanes.config import ModelConfig
from lanes.kernels.chunked_delta import slot_shape as chunked_delta_slot
from lanes.models.mamba2 import mamba2_state_shapes


@dataclass(frozen=True)
class RecurrentLayout:
    conv: tuple[int, int]  # [channels, kernel - 1] per layer
    state: tuple[int, int, int]  # per layer
    deferred_widths: tuple[int, ...]  # a verify row's saved inputs: (mixed, b, a) or (xbc, dt)


def recurrent_layout(cfg: ModelConfig, chunked_delta: bool = False) -> RecurrentLayout:
    """chunked_delta: DeltaNet slots hold the chunked form's carry (kernels/chunked_delta.py)."""
    if cfg.mamba is not None:
        conv, state = mamba2_state_shapes(cfg.mamba)
        return RecurrentLayout(conv, state, (cfg.mamba.conv_dim, cfg.mamba.heads))
    hv = cfg.linear_num_value_heads
    conv_dim = 2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim
    conv_dim += hv * cfg.linear_value_head_dim
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    state = chunked_delta_slot(hv, dk, dv) if chunked_delta else (hv, dk, dv)
    return RecurrentLayout((conv_dim, cfg.linear_conv_kernel - 1), state, (conv_dim, hv, hv))
