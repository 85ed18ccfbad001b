"""The gated delta rule of a DeltaNet layer, position by position, in plain torch (the CPU ops'
form; TritonOps runs kernels/delta_rule.py instead).

One lane's rows, with its conv window (the last `kernel - 1` inputs) and recurrent state S
[value heads, dk, dv], both float32:

    q, k, v = silu(depthwise causal conv(mixed))        q, k L2-normalised; q / sqrt(dk)
    beta = sigmoid(b),  decay = exp(neg_a * softplus(a + dt_bias))
    S = decay * S;  S = S + k (beta (v - S^T k))^T;  o = S^T q
    out = gated_rmsnorm(o, z) = norm(o) * weight * silu(z)

Every position is the same per-token computation on tensors whose shapes depend only on the
model, in a fixed order: a position's bits do not depend on the chunk, the step kind or the
other lanes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

L2_EPS = 1e-6  # transformers' l2norm (and flash-linear-attention's)


@dataclass(frozen=True)
class DeltaRuleWeights:
    """A DeltaNet layer's parameters the recurrence reads, and its head layout."""

    taps: torch.Tensor  # [conv_dim, kernel] float32: the depthwise causal conv
    neg_a: torch.Tensor  # [v_heads] float32: -exp(A_log)
    dt_bias: torch.Tensor  # [v_heads] float32
    norm: torch.Tensor  # [dv] model dtype: the gated RMSNorm's weight
    key_heads: int
    value_heads: int
    key_dim: int
    value_dim: int
    eps: float  # the gated RMSNorm's


def delta_rule_steps(
    mixed: torch.Tensor,  # [T, conv_dim] the conv's inputs (q | k | v channels)
    z: torch.Tensor,  # [T, value_heads * dv] the output gate
    b: torch.Tensor,  # [T, value_heads]
    a: torch.Tensor,  # [T, value_heads]
    conv: torch.Tensor,  # [conv_dim, kernel - 1] float32
    state: torch.Tensor,  # [value_heads, dk, dv] float32
    w: DeltaRuleWeights,
    keep: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list | None]:
    """(out [T, value_heads, dv] in the model dtype, conv and state after the last row, and with
    `keep` the (conv, state) after every row)."""
    hk, hv, dk, dv = w.key_heads, w.value_heads, w.key_dim, w.value_dim
    out = torch.empty((mixed.shape[0], hv, dv), dtype=w.norm.dtype, device=mixed.device)
    kept = [] if keep else None
    for r in range(mixed.shape[0]):
        window = torch.cat([conv, mixed[r].float()[:, None]], dim=1)  # [conv_dim, kernel]
        conv = window[:, 1:]
        qkv = F.silu((window * w.taps).sum(dim=1))
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
        o = (state * q[:, :, None]).sum(dim=1)  # [hv, dv]: S^T q
        out[r] = _gated_rms_norm(o, z[r].view(hv, dv), w.norm, w.eps)
        if kept is not None:
            kept.append((conv, state))
    return out, conv, state, kept


def _l2_normalised(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + L2_EPS)


def _gated_rms_norm(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """RMSNorm of each head's output [heads, dv] (float32), times weight, times silu(gate); in
    the model dtype, the way transformers rounds it."""
    normed = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (weight * normed.to(weight.dtype) * F.silu(gate.float())).to(weight.dtype)
