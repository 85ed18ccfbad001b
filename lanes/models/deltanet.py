"""The gated DeltaNet token mixer of hybrid models (Qwen3.5's "linear attention" layers): the
projections here, the recurrence through the ops (`ops.delta_rule`: kernels/delta_rule.py's torch
form on the CPU ops, its Triton kernels on the Triton ops), each lane's state read from and
written back to its slot. In a CUDA graph (`batch.lane_states`) one launch runs every lane, its
slot named on the device. Verify steps only read the state; `settle_deltanet` runs the accepted
rows again once they are known.

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
    each lane's state slot (verify steps only read it: `StatePool.defer`)."""
    hv, dv = cfg.linear_num_value_heads, cfg.linear_value_head_dim
    mixed, z, b, a = _projections(ops, x, w, cfg)
    rule = _rule(w, cfg)
    lanes = batch.lane_states
    if lanes is not None:  # a CUDA graph: every lane's rows in one launch, slots on the device
        conv_pool, state_pool = states.conv[:, layer], states.recurrent[:, layer]
        core = ops.delta_rule_lanes(
            mixed, z, b, a, conv_pool, state_pool, lanes.slots, lanes.rows_per_lane, rule,
            advance=not lanes.keep,
        )  # fmt: skip
        if lanes.keep:  # settled on the host once acceptance is known: see LaneStates
            for saved, value in zip(lanes.saved[layer], (mixed, b, a), strict=True):
                saved.copy_(value)
        return ops.linear(core.view(x.shape[0], hv * dv), w.out)
    if x.shape[0] and not batch.seqs:
        raise ValueError("a hybrid model's forward needs its lanes' rows (seqs or lane_states)")
    core = torch.empty((x.shape[0], hv, dv), dtype=x.dtype, device=x.device)
    for seq in batch.seqs:
        conv, state = states.read(seq.state_slot, layer, seq.first_position)
        rows = slice(seq.query_start, seq.query_start + seq.num_queries)
        core[rows], conv, state = ops.delta_rule(
            mixed[rows], z[rows], b[rows], a[rows], conv, state, rule, seq.first_position
        )
        if seq.keep_states:  # the state stays; settle runs the accepted rows again
            states.defer(seq.state_slot, layer, seq.first_position, (mixed[rows], b[rows], a[rows]))
        else:
            states.write(seq.state_slot, layer, seq.context_len, conv, state)
    return ops.linear(core.view(x.shape[0], hv * dv), w.out)


def settle_deltanet(
    ops: Ops,
    w: DeltaNetWeights,
    cfg: ModelConfig,
    states: StatePool,
    slot: int,
    layer: int,
    first_position: int,
    inputs: tuple[torch.Tensor, ...],  # the verify rows' (mixed, b, a)
    num_rows: int,
) -> None:
    """After a verify step from first_position: the layer's state advanced by its first
    num_rows rows (the accepted ones), the same per-row arithmetic as the forward ran."""
    mixed, b, a = (t[:num_rows] for t in inputs)
    conv, state = states.read(slot, layer, first_position)
    _, conv, state = ops.delta_rule(mixed, None, b, a, conv, state, _rule(w, cfg), first_position)
    states.write(slot, layer, first_position + num_rows, conv, state)


def _projections(ops: Ops, x: torch.Tensor, w: DeltaNetWeights, cfg: ModelConfig):
    """(mixed [n, conv_dim], z [n, value_dim], b [n, value_heads], a [n, value_heads]): views
    of one projection."""
    hk, hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    conv_dim = 2 * hk * dk + hv * dv
    return ops.linear(x, w.in_proj).split([conv_dim, hv * dv, hv, hv], dim=-1)


def _rule(w: DeltaNetWeights, cfg: ModelConfig) -> DeltaRuleWeights:
    return DeltaRuleWeights(
        taps=w.conv.float(),
        neg_a=w.neg_a,
        dt_bias=w.dt_bias,
        norm=w.norm,
        key_heads=cfg.linear_num_key_heads,
        value_heads=cfg.linear_num_value_heads,
        key_dim=cfg.linear_key_head_dim,
        value_dim=cfg.linear_value_head_dim,
        eps=cfg.rms_norm_eps,
    )
