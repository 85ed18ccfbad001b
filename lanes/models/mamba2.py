"""The Mamba-2 token mixer of Nemotron-H's "linear attention" layers (issue 44): the reference
form, one lane's tokens in order with its state carried in and out. Not yet wired into the
decoder: Nemotron-H's layers (each one mixer — Mamba-2, attention, a ReLU² MLP or MoE — with its
own norm) and its state slots come next; the states have the gated DeltaNet's two shapes (a conv
window and a recurrent state per layer), so they fit `cache/state_pool.py` as they are.

Per token t, for head h of group g = h // (heads / groups):

    z, xBC, dt = in_proj(x)                  z, dt: the gate and the time step of every head
    xBC = silu(causal depthwise conv(xBC))    over the layer's last `kernel` inputs
    x, B, C = split(xBC)                      x [heads, head_dim], B, C [groups, state]
    dt = clamp(softplus(dt + dt_bias))
    S_h = exp(dt_h * A_h) * S_h + dt_h * x_h ⊗ B_g          [head_dim, state]
    y_h = S_h @ C_g + D_h * x_h
    out = out_proj(group_rms_norm(y * silu(z)) * norm)

Exactness as in lanes/models/deltanet.py: every token goes through the same float32 recurrence
in order, on shapes that depend only on the model, so a token's bits do not depend on where a
prompt is split, whether it is prefilled or decoded, or on other lanes; only the projections go
through the (batch-invariant) ops. transformers evaluates a prompt with a chunked algorithm (the
same math in another order: equal to ~1e-6 in float32).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from lanes.ops import Ops


@dataclass(frozen=True)
class Mamba2Shape:
    heads: int  # mamba_num_heads
    head_dim: int  # mamba_head_dim
    state: int  # ssm_state_size
    groups: int  # n_groups: heads share B and C within a group
    kernel: int  # conv_kernel
    eps: float  # the gated norm's
    dt_min: float = 0.0  # time_step_limit
    dt_max: float = float("inf")

    @property
    def inner(self) -> int:
        return self.heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        return self.inner + 2 * self.groups * self.state


@dataclass
class Mamba2Weights:
    in_proj: torch.Tensor  # [inner + conv_dim + heads, hidden]: z, xBC, dt
    conv: torch.Tensor  # [conv_dim, kernel] depthwise, oldest input first
    conv_bias: torch.Tensor | None  # [conv_dim]
    dt_bias: torch.Tensor  # [heads] float32
    neg_a: torch.Tensor  # [heads] float32: -exp(A_log)
    d: torch.Tensor  # [heads] float32: the skip
    norm: torch.Tensor  # [inner]: the gated group norm's weight
    out: torch.Tensor  # [hidden, inner]


def mamba2_state_shapes(shape: Mamba2Shape) -> tuple[tuple[int, int], tuple[int, int, int]]:
    """(conv state [conv_dim, kernel - 1], recurrent state [heads, head_dim, state])."""
    return (shape.conv_dim, shape.kernel - 1), (shape.heads, shape.head_dim, shape.state)


def mamba2_mixer(
    ops: Ops,
    x: torch.Tensor,  # [tokens, hidden], normed, one lane's in order
    w: Mamba2Weights,
    shape: Mamba2Shape,
    conv_state: torch.Tensor,  # [conv_dim, kernel - 1] float32: the inputs before x
    ssm_state: torch.Tensor,  # [heads, head_dim, state] float32
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(output [tokens, hidden] before the residual add, the conv state and the recurrent state
    after the last token); the states passed in are not changed."""
    s = shape
    proj = ops.linear(x, w.in_proj).float()
    z, xbc, dt = proj.split([s.inner, s.conv_dim, s.heads], dim=-1)
    seq = torch.cat([conv_state.T.float(), xbc])  # [kernel - 1 + tokens, conv_dim]: raw inputs
    conv = w.conv.float()
    per_group = s.heads // s.groups
    state = ssm_state.clone()
    rows = []
    # every step on tensors of the model's shapes alone: elementwise kernels round a vector's
    # tail differently from its body, so a [tokens, ...] tensor would tie a token's bits to T
    for t in range(x.shape[0]):
        mixed = seq[t] * conv[:, 0]
        for j in range(1, s.kernel):  # the taps oldest first
            mixed = mixed + seq[t + j] * conv[:, j]
        if w.conv_bias is not None:
            mixed = mixed + w.conv_bias.float()
        mixed = F.silu(mixed)
        xt, bt, ct = mixed.split([s.inner, s.groups * s.state, s.groups * s.state])
        xt = xt.view(s.heads, s.head_dim)
        bt = bt.view(s.groups, s.state).repeat_interleave(per_group, dim=0)  # [heads, state]
        ct = ct.view(s.groups, s.state).repeat_interleave(per_group, dim=0)
        step = F.softplus(dt[t] + w.dt_bias).clamp(s.dt_min, s.dt_max)  # [heads]
        decay = torch.exp(step * w.neg_a)
        state = state * decay[:, None, None] + (step[:, None] * xt)[:, :, None] * bt[:, None, :]
        y = (state * ct[:, None, :]).sum(-1) + w.d[:, None] * xt  # [heads, head_dim]
        rows.append(_gated_group_norm(y.reshape(s.inner), z[t], w.norm, s))
    new_conv = seq[seq.shape[0] - (s.kernel - 1) :].T.contiguous()
    normed = torch.stack(rows) if rows else proj.new_zeros((0, s.inner))
    return ops.linear(normed.to(x.dtype), w.out), new_conv, state


def _gated_group_norm(
    y: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, s: Mamba2Shape
) -> torch.Tensor:
    """One token's RMS norm of y * silu(z) [inner] within each group of inner / groups channels,
    times the weight."""
    grouped = (y * F.silu(z)).view(s.groups, s.inner // s.groups)
    grouped = grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + s.eps)
    return weight.float() * grouped.reshape(s.inner)
