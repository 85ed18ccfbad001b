"""Paged causal attention in plain torch: the exact (tiled) reference and the fast (SDPA) baseline."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lanes.batch import ForwardBatch

# Exact mode tiles. Keys are reduced in tiles of KEY_TILE absolute positions (0..63, 64..127, ...)
# and queries go through in tiles of QUERY_TILE rows, so every product has one shape and a query's
# merge order depends only on its own position: prefill, decode and verify agree bitwise.
KEY_TILE = 64
QUERY_TILE = 16


def exact_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: ForwardBatch
) -> torch.Tensor:
    """q [num_tokens, num_heads, head_dim]; caches [num_slots, num_kv_heads, head_dim].

    Returns [num_tokens, num_heads, head_dim]. For each lane: online softmax over key tiles in
    ascending order; a tile entirely after a query's position leaves its state unchanged bitwise
    (scores -inf, weights exactly 0, rescale factor exactly 1).
    """
    out = torch.empty_like(q)
    for seq in batch.seqs:
        rows = slice(seq.query_start, seq.query_start + seq.num_queries)
        out[rows] = _exact_one_seq(q[rows], k_cache, v_cache, seq.kv_slots, seq.first_position)
    return out


def _exact_one_seq(q, k_cache, v_cache, kv_slots, first_position):
    num_queries, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    group = num_heads // num_kv_heads
    context_len = kv_slots.shape[0]
    num_qtiles = -(-num_queries // QUERY_TILE)
    pad_q = num_qtiles * QUERY_TILE - num_queries
    # Padded query rows repeat the last real query so that no row is entirely masked.
    q_pos = torch.arange(num_queries, device=q.device) + first_position
    if pad_q:
        q = torch.cat([q, q[-1:].expand(pad_q, -1, -1)])
        q_pos = torch.cat([q_pos, q_pos[-1:].expand(pad_q)])
    # [num_qtiles, num_kv_heads, group * QUERY_TILE, head_dim]; row = (head in group, query)
    q_t = (
        q.float()
        .view(num_qtiles, QUERY_TILE, num_kv_heads, group, head_dim)
        .permute(0, 2, 3, 1, 4)
        .reshape(num_qtiles, num_kv_heads, group * QUERY_TILE, head_dim)
    )
    q_pos_rows = (
        q_pos.view(num_qtiles, 1, QUERY_TILE).expand(-1, group, -1).reshape(num_qtiles, 1, -1)
    )
    scale = head_dim**-0.5
    shape = (num_qtiles, num_kv_heads, group * QUERY_TILE)
    m = torch.full(shape, float("-inf"), device=q.device)
    denom = torch.zeros(shape, device=q.device)
    acc = torch.zeros((*shape, head_dim), device=q.device)
    for start in range(0, context_len, KEY_TILE):
        key_pos = torch.arange(start, start + KEY_TILE, device=q.device)
        slots = kv_slots[start : start + KEY_TILE]
        if slots.shape[0] < KEY_TILE:  # past the context: any slot, always masked below
            slots = torch.cat([slots, slots[:1].expand(KEY_TILE - slots.shape[0])])
        k = k_cache[slots].float().permute(1, 2, 0)  # [num_kv_heads, head_dim, KEY_TILE]
        v = v_cache[slots].float().permute(1, 0, 2)  # [num_kv_heads, KEY_TILE, head_dim]
        scores = torch.matmul(q_t, k) * scale  # [num_qtiles, num_kv_heads, rows, KEY_TILE]
        visible = key_pos.view(1, 1, 1, -1) <= q_pos_rows.unsqueeze(-1)
        scores = scores.masked_fill(~visible, float("-inf"))
        m_new = torch.maximum(m, scores.amax(dim=-1))
        alpha = torch.exp(m - m_new)
        p = torch.exp(scores - m_new.unsqueeze(-1))
        denom = denom * alpha + p.sum(dim=-1)
        acc = acc * alpha.unsqueeze(-1) + torch.matmul(p, v)
        m = m_new
    o = acc / denom.unsqueeze(-1)
    o = (
        o.view(num_qtiles, num_kv_heads, group, QUERY_TILE, head_dim)
        .permute(0, 3, 1, 2, 4)
        .reshape(num_qtiles * QUERY_TILE, num_heads, head_dim)
    )
    return o[:num_queries].to(q.dtype)


def sdpa_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: ForwardBatch
) -> torch.Tensor:
    """The fast baseline: PyTorch SDPA per lane over its gathered context. Not batch-invariant."""
    out = torch.empty_like(q)
    group = q.shape[1] // k_cache.shape[1]
    for seq in batch.seqs:
        rows = slice(seq.query_start, seq.query_start + seq.num_queries)
        # [1, num_heads, context_len, head_dim], contiguous, KV heads repeated: the layout the
        # fused SDPA kernels take (otherwise SDPA falls back to materialising the scores)
        k = k_cache[seq.kv_slots].repeat_interleave(group, dim=1).transpose(0, 1)[None].contiguous()
        v = v_cache[seq.kv_slots].repeat_interleave(group, dim=1).transpose(0, 1)[None].contiguous()
        qs = q[rows].transpose(0, 1)[None].contiguous()  # [1, num_heads, num_queries, head_dim]
        if seq.num_queries == 1:  # decode: every key is visible
            o = F.scaled_dot_product_attention(qs, k, v)
        elif seq.num_queries == seq.context_len:  # a prompt from its start
            o = F.scaled_dot_product_attention(qs, k, v, is_causal=True)
        else:
            q_pos = torch.arange(seq.num_queries, device=q.device) + seq.first_position
            mask = torch.arange(seq.context_len, device=q.device).view(1, -1) <= q_pos.view(-1, 1)
            o = F.scaled_dot_product_attention(qs, k, v, attn_mask=mask)
        out[rows] = o[0].transpose(0, 1)
    return out
