"""Ops on Triton kernels (kernels/): batch-invariant on the GPU, as ExactOps is on the CPU."""

from __future__ import annotations

import dataclasses

from lanes.batch import ForwardBatch
from lanes.kernels.attention import make_meta, paged_attention
from lanes.kernels.kv_write import kv_write
from lanes.kernels.matmul import matmul
from lanes.kernels.rmsnorm import add_rms_norm
from lanes.kernels.rope import rope
from lanes.ops import Ops


class TritonOps(Ops):
    name = "triton"
    is_batch_invariant = True

    def prepare(self, batch: ForwardBatch) -> ForwardBatch:
        if batch.attn_meta is not None:  # static layout of a CUDA graph
            return batch
        return dataclasses.replace(batch, attn_meta={})  # filled per GQA group on first use

    def _linear(self, x, weight, bias=None):
        return matmul(x.contiguous(), weight, bias)

    def rms_norm(self, x, weight, eps):
        return add_rms_norm(x.contiguous(), None, weight, eps)[1]

    def add_rms_norm(self, x, residual, weight, eps):
        return add_rms_norm(x.contiguous(), residual, weight, eps)

    def write_kv(self, k_cache, v_cache, slots, k, v):
        kv_write(k_cache, v_cache, slots, k, v)

    def rope(self, x, cos, sin):
        return rope(x.contiguous(), cos, sin)

    def attention(self, q, k_cache, v_cache, batch):
        group = q.shape[1] // k_cache.shape[1]
        meta = batch.attn_meta.get(group)
        if meta is None:
            seqs = [(s.query_start, s.num_queries, s.context_len, s.kv_slots) for s in batch.seqs]
            meta = batch.attn_meta[group] = make_meta(seqs, group, q.device)
        return paged_attention(q.contiguous(), k_cache, v_cache, meta)


__all__ = ["TritonOps"]
