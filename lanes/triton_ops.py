"""Ops on Triton kernels (kernels/): batch-invariant on the GPU, as ExactOps is on the CPU."""

from __future__ import annotations

import dataclasses

from lanes.batch import ForwardBatch
from lanes.kernels import chunked_delta as chunked_form
from lanes.kernels.activation import silu_mul
from lanes.kernels.attention import make_meta, paged_attention, rows_for
from lanes.kernels.delta_rule import gated_delta, gated_delta_lanes
from lanes.kernels.expert_matmul import expert_matmul, expert_tiles
from lanes.kernels.kv_write import kv_write
from lanes.kernels.mamba2 import ssd_scan, ssd_scan_lanes
from lanes.kernels.matmul import matmul
from lanes.kernels.moe_route import combine_experts, route_experts
from lanes.kernels.rmsnorm import add_rms_norm
from lanes.kernels.rope import rope, rope_kv_write
from lanes.ops import Ops


class TritonOps(Ops):
    name = "triton"
    is_batch_invariant = True

    def __init__(self, chunked_delta: bool = False) -> None:
        self.chunked_delta = chunked_delta

    def prepare(self, batch: ForwardBatch) -> ForwardBatch:
        if batch.attn_meta is not None:  # static layout of a CUDA graph
            return batch
        return dataclasses.replace(batch, attn_meta={})  # filled per GQA group on first use

    def linear(self, x, weight, bias=None):
        """A PackedWeight goes to the kernel whole (not in float tiles, as Ops.linear does):
        its codes are dequantized in registers, so a decode step reads the codes only."""
        return matmul(x.contiguous(), weight, bias)

    _linear = linear  # float weights: the same kernel

    def glu_linear(self, gate_up, weight):
        return matmul(silu_mul(gate_up.contiguous()), weight)

    def experts(self, x, experts, gate_up, down):
        """Two grouped launches over every (token, expert) slot, routed on the device: no host
        read of which experts were chosen, so MoE layers replay in CUDA graphs."""
        tiles = expert_tiles(experts.reshape(-1), gate_up.shape[0])
        hidden = expert_matmul(x.contiguous(), gate_up, tiles, experts.shape[1])
        return expert_matmul(silu_mul(hidden), down, tiles, 1)

    def route_experts(self, router_logits, k, normalise):
        """One launch: a program per token (softmax, k passes of a max) in place of a softmax,
        a stable sort over every expert and the slicing after it."""
        return route_experts(router_logits, k, normalise)

    def combine_experts(self, outputs, weights):
        """One launch with the torch form's bits, in place of 2k - 1 elementwise ones."""
        return combine_experts(outputs, weights)

    def attention_inputs(self, q, k, v, cos, sin, k_cache, v_cache, slots, rope_dim, norms, eps):
        if rope_dim != q.shape[-1]:  # partial RoPE (Qwen3.5): the unfused steps
            return super().attention_inputs(
                q, k, v, cos, sin, k_cache, v_cache, slots, rope_dim, norms, eps
            )
        return rope_kv_write(q, k, v, cos, sin, k_cache, v_cache, slots, norms, eps)

    def rms_norm(self, x, weight, eps):
        return add_rms_norm(x.contiguous(), None, weight, eps)[1]

    def add_rms_norm(self, x, residual, weight, eps):
        return add_rms_norm(x.contiguous(), residual, weight, eps)

    def write_kv(self, k_cache, v_cache, slots, k, v):
        kv_write(k_cache, v_cache, slots, k, v)

    def rope(self, x, cos, sin):
        return rope(x.contiguous(), cos, sin)

    def delta_rule(self, mixed, z, b, a, conv, state, w, position=0):
        """One launch for a lane's rows (a program per value head walks them in order) instead
        of a dozen torch calls per row and layer; or, with chunked_delta, the chunked form from
        the carry the slot holds (five launches)."""
        if not self.chunked_delta:
            return gated_delta(mixed, z, b, a, conv, state, w)
        carry = chunked_form.carry_from_slot(conv, state, position, w.key_dim, w.value_dim)
        out, after = chunked_form.chunked_gated_delta(mixed, z, b, a, carry, w)
        return out, after.conv, chunked_form.slot_from_carry(after)

    def delta_rule_lanes(
        self, mixed, z, b, a, conv_pool, state_pool, slots, rows_per_lane, w, advance
    ):
        if self.chunked_delta:  # build_runner builds no graphs for them
            raise NotImplementedError("chunked DeltaNet layers have no CUDA-graph form yet")
        return gated_delta_lanes(
            mixed, z, b, a, conv_pool, state_pool, slots, rows_per_lane, w, advance
        )

    def mamba2(self, xbc, z, dt, conv, state, w):
        """One launch for a lane's rows (a program per head and block of its rows walks them in
        order), then one for the gated norm."""
        return ssd_scan(xbc, z, dt, conv, state, w)

    def mamba2_lanes(self, xbc, z, dt, conv_pool, state_pool, slots, rows_per_lane, w, advance):
        return ssd_scan_lanes(xbc, z, dt, conv_pool, state_pool, slots, rows_per_lane, w, advance)

    def attention(self, q, k_cache, v_cache, batch):
        group = q.shape[1] // k_cache.shape[1]
        meta = batch.attn_meta.get(group)
        if meta is None:
            seqs = [(s.query_start, s.num_queries, s.context_len, s.kv_slots) for s in batch.seqs]
            rows = rows_for(q.shape[0], q.dtype, q.device, q.shape[2])
            meta = batch.attn_meta[group] = make_meta(seqs, group, q.device, rows)
        return paged_attention(q.contiguous(), k_cache, v_cache, meta)


__all__ = ["TritonOps"]
