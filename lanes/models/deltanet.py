"""The gated DeltaNet token mixer of hybrid models (Qwen3.5's "linear attention" layers): the
projections here, the recurrence through the ops (`ops.delta_rule`: kernels/delta_rule.py's torch
form on the CPU ops, its Triton kernels on the Triton ops), each lane's state read from and
written back to its slot.

Exactness: every position is computed by the same per-token recurrence on tensors whose shapes
depend only on the model (never on how many rows, lanes or chunks a forward has), in a fixed
order, in float32. So a position's bits do not depend on whether prefill, decode or verify
computes it, on chunk boundaries, or on the other lanes; only the projections go through the
batch-invariant ops. (transformers evaluates prefill with a chunked algorithm: the same math,
a different summation order, equal to ~1e-6 in float32.)
"""

from __future__ import annotations

import torch

from lanes.batch import ForwardBatch
from lanes.cache.state_pool import StatePool
from lanes.config import ModelConfig
from lanes.kernels.delta_rule import DeltaRuleWeights
from lanes.models.weights import DeltaNetWeights
from lanes.ops import Ops


def deltanet_state_shapes(cfg: ModelConfig) -> tuple[tuple[int, int], tuple[int, int, int]]:
    """(conv state [channels, kernel - 1], recurrent state [value heads, dk, dv]) per layer."""
    key_dim = cfg.linear_num_key_heads * cfg.linear_key_head_dim
    conv_dim = 2 * key_dim + cfg.linear_num_value_heads * cfg.linear_value_head_dim
    return (conv_dim, cfg.linear_conv_kernel - 1), (
        cfg.linear_num_value_heads,
        cfg.linear_key_head_dim,
        cfg.linear_value_head_dim,
    )


def gated_deltanet(
    ops: Ops,
    x: torch.Tensor,  # [num_tokens, hidden], normed
    w: DeltaNetWeights,
    cfg: ModelConfig,
    batch: ForwardBatch,
    states: StatePool,
    layer: int,  # index among the linear-attention layers
) -> torch.Tensor:
    """The mixer's output [num_tokens, hidden] (before the residual add); reads and writes
    each lane's state slot."""
    hk, hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    conv_dim = 2 * hk * dk + hv * dv
    mixed, z, b, a = ops.linear(x, w.in_proj).split([conv_dim, hv * dv, hv, hv], dim=-1)
    rule = DeltaRuleWeights(
        taps=w.conv.float(),
        neg_a=w.neg_a,
        dt_bias=w.dt_bias,
        norm=w.norm,
        key_heads=hk,
        value_heads=hv,
        key_dim=dk,
        value_dim=dv,
        eps=cfg.rms_norm_eps,
    )
    core = torch.empty((x.shape[0], hv, dv), dtype=x.dtype, device=x.device)
    for seq in batch.seqs:
        conv, state = states.read(seq.state_slot, layer, seq.first_position)
        rows = slice(seq.query_start, seq.query_start + seq.num_queries)
        core[rows], conv, state, kept = ops.delta_rule(
            mixed[rows], z[rows], b[rows], a[rows], conv, state, rule, seq.keep_states
        )
        states.write(seq.state_slot, layer, seq.context_len, conv, state, kept, seq.first_position)
    return ops.linear(core.view(x.shape[0], hv * dv), w.out)
