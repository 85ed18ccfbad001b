"""The gated DeltaNet token mixer of hybrid models (Qwen3.5's "linear attention" layers).

Per lane and position t, with the lane's recurrent state S [value heads, dk, dv] and the causal
conv's window of the last `kernel` inputs:

    q, k, v = silu(depthwise causal conv(in_proj_qkv x))        q, k L2-normalised; q / sqrt(dk)
    beta = sigmoid(b),  decay = exp(-exp(A_log) * softplus(a + dt_bias))
    S = decay * S;  S = S + k (beta (v - S^T k))^T;  o = S^T q
    out = out_proj(gated_rmsnorm(o, z) = norm(o) * weight * silu(z))

Exactness: every position is computed by the same per-token recurrence on tensors whose shapes
depend only on the model (never on how many rows, lanes or chunks a forward has), in a fixed
order, in float32. So a position's bits do not depend on whether prefill, decode or verify
computes it, on chunk boundaries, or on the other lanes; only the projections go through the
batch-invariant ops. (transformers evaluates prefill with a chunked algorithm: the same math,
a different summation order, equal to ~1e-6 in float32.)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lanes.batch import ForwardBatch
from lanes.cache.state_pool import StatePool
from lanes.config import ModelConfig
from lanes.models.weights import DeltaNetWeights
from lanes.ops import Ops

L2_EPS = 1e-6  # transformers' l2norm (and flash-linear-attention's)


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
    taps = w.conv.float()  # [conv_dim, kernel]
    core = torch.empty((x.shape[0], hv, dv), dtype=x.dtype, device=x.device)
    for seq in batch.seqs:
        conv, state = states.read(seq.state_slot, layer, seq.first_position)
        kept = [] if seq.keep_states else None
        for r in range(seq.query_start, seq.query_start + seq.num_queries):
            window = torch.cat([conv, mixed[r].float()[:, None]], dim=1)  # [conv_dim, kernel]
            conv = window[:, 1:]
            qkv = F.silu((window * taps).sum(dim=1))
            q, k, v = qkv.split([hk * dk, hk * dk, hv * dv])
            q, k = _l2_normalised(q.view(hk, dk)), _l2_normalised(k.view(hk, dk))
            if hv != hk:  # each key head serves hv / hk consecutive value heads
                q, k = q.repeat_interleave(hv // hk, 0), k.repeat_interleave(hv // hk, 0)
            q = q / dk**0.5
            beta = torch.sigmoid(b[r].float())  # [hv]
            decay = torch.exp(w.neg_a * F.softplus(a[r].float() + w.dt_bias))
            state = state * decay[:, None, None]
            remembered = (state * k[:, :, None]).sum(dim=1)  # [hv, dv]: S^T k
            delta = (v.view(hv, dv) - remembered) * beta[:, None]
            state = state + k[:, :, None] * delta[:, None, :]
            out = (state * q[:, :, None]).sum(dim=1)  # [hv, dv]: S^T q
            core[r] = _gated_rms_norm(out, z[r].view(hv, dv), w.norm, cfg.rms_norm_eps)
            if kept is not None:
                kept.append((conv, state))
        states.write(seq.state_slot, layer, seq.context_len, conv, state, kept, seq.first_position)
    return ops.linear(core.view(x.shape[0], hv * dv), w.out)


def _l2_normalised(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + L2_EPS)


def _gated_rms_norm(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """RMSNorm of each head's output [heads, dv] (float32), times weight, times silu(gate); in
    the model dtype, the way transformers rounds it."""
    normed = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (weight * normed.to(weight.dtype) * F.silu(gate.float())).to(weight.dtype)
