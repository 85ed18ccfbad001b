"""The Mamba-2 token mixer of Nemotron-H's linear-attention layers: the projections here, the
conv and scan through the ops (`ops.mamba2`: kernels/mamba2.py's torch form on the CPU ops, its
Triton kernels on the Triton ops), each lane's state read from and written back to its slot. In
a CUDA graph (`batch.lane_states`) one launch runs every lane, its slot named on the device.
Verify steps only read the state; `settle_mamba2` runs the accepted rows again once they are
known. The state has the gated DeltaNet's two parts (a conv window and a recurrent state per
layer), so it lives in the same pool (cache/state_pool.py) under the same contract.

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
prompt is split, whether it is prefilled, decoded or verified, or on other lanes; only the
projections go through the (batch-invariant) ops. transformers evaluates a prompt with a chunked
algorithm (the same math in another order: equal to ~1e-6 in float32).
"""

from __future__ import annotations

import torch

from lanes.batch import ForwardBatch
from lanes.cache.state_pool import StatePool
from lanes.config import Mamba2Shape
from lanes.kernels.mamba2 import Mamba2Rule
from lanes.models.weights import Mamba2Weights
from lanes.ops import Ops

__all__ = ["Mamba2Shape", "Mamba2Weights", "mamba2_layer", "mamba2_mixer", "settle_mamba2"]


def mamba2_state_shapes(shape: Mamba2Shape) -> tuple[tuple[int, int], tuple[int, int, int]]:
    """(conv state [conv_dim, kernel - 1], recurrent state [heads, head_dim, state])."""
    return (shape.conv_dim, shape.kernel - 1), (shape.heads, shape.head_dim, shape.state)


def mamba2_layer(
    ops: Ops,
    x: torch.Tensor,  # [num_tokens, hidden], normed
    w: Mamba2Weights,
    shape: Mamba2Shape,
    batch: ForwardBatch,
    states: StatePool,
    layer: int,  # index among the linear-attention layers
) -> torch.Tensor:
    """The mixer's output [num_tokens, hidden] (before the residual add); reads and writes each
    lane's state slot (verify steps only read it: `StatePool.defer`)."""
    z, xbc, dt = _projections(ops, x, w, shape)
    rule = mamba2_rule(w, shape)
    lanes = batch.lane_states
    if lanes is not None:  # a CUDA graph: every lane's rows in one launch, slots on the device
        conv_pool, state_pool = states.conv[:, layer], states.recurrent[:, layer]
        out = ops.mamba2_lanes(
            xbc, z, dt, conv_pool, state_pool, lanes.slots, lanes.rows_per_lane, rule,
            advance=not lanes.keep,
        )  # fmt: skip
        if lanes.keep:  # settled on the host once acceptance is known: see LaneStates
            for saved, value in zip(lanes.saved[layer], (xbc, dt), strict=True):
                saved.copy_(value)
        return ops.linear(out, w.out)
    if x.shape[0] and not batch.seqs:
        raise ValueError("a hybrid model's forward needs its lanes' rows (seqs or lane_states)")
    out = torch.empty((x.shape[0], shape.inner), dtype=x.dtype, device=x.device)
    for seq in batch.seqs:
        conv, state = states.read(seq.state_slot, layer, seq.first_position)
        rows = slice(seq.query_start, seq.query_start + seq.num_queries)
        out[rows], conv, state = ops.mamba2(xbc[rows], z[rows], dt[rows], conv, state, rule)
        if seq.keep_states:  # the state stays; settle runs the accepted rows again
            states.defer(seq.state_slot, layer, seq.first_position, (xbc[rows], dt[rows]))
        else:
            states.write(seq.state_slot, layer, seq.context_len, conv, state)
    return ops.linear(out, w.out)


def settle_mamba2(
    ops: Ops,
    w: Mamba2Weights,
    shape: Mamba2Shape,
    states: StatePool,
    slot: int,
    layer: int,
    first_position: int,
    inputs: tuple[torch.Tensor, ...],  # the verify rows' (xbc, dt)
    num_rows: int,
) -> None:
    """After a verify step from first_position: the layer's state advanced by its first
    num_rows rows (the accepted ones), the same per-row arithmetic as the forward ran."""
    xbc, dt = (t[:num_rows] for t in inputs)
    conv, state = states.read(slot, layer, first_position)
    _, conv, state = ops.mamba2(xbc, None, dt, conv, state, mamba2_rule(w, shape))
    states.write(slot, layer, first_position + num_rows, conv, state)


def mamba2_mixer(
    ops: Ops,
    x: torch.Tensor,  # [tokens, hidden], normed, one lane's in order
    w: Mamba2Weights,
    shape: Mamba2Shape,
    conv_state: torch.Tensor,  # [conv_dim, kernel - 1] float32: the inputs before x
    ssm_state: torch.Tensor,  # [heads, head_dim, state] float32
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One lane's mixer, its states passed in (not changed) and returned: (output [tokens,
    hidden] before the residual add, the conv state and the recurrent state after the last
    token)."""
    z, xbc, dt = _projections(ops, x, w, shape)
    out, conv, state = ops.mamba2(xbc, z, dt, conv_state, ssm_state, mamba2_rule(w, shape))
    return ops.linear(out, w.out), conv, state


def mamba2_rule(w: Mamba2Weights, shape: Mamba2Shape) -> Mamba2Rule:
    bias = w.conv_bias if w.conv_bias is not None else torch.zeros_like(w.conv[:, 0])
    return Mamba2Rule(
        taps=w.conv.float(),
        conv_bias=bias.float(),
        dt_bias=w.dt_bias,
        neg_a=w.neg_a,
        d=w.d,
        norm=w.norm,
        heads=shape.heads,
        head_dim=shape.head_dim,
        state=shape.state,
        groups=shape.groups,
        eps=shape.eps,
        dt_min=shape.dt_min,
        dt_max=shape.dt_max,
    )


def _projections(ops: Ops, x: torch.Tensor, w: Mamba2Weights, shape: Mamba2Shape):
    """(z [n, inner], xBC [n, conv_dim], dt [n, heads]): views of one projection."""
    return ops.linear(x, w.in_proj).split([shape.inner, shape.conv_dim, shape.heads], dim=-1)
