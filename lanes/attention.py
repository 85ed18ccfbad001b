"""Paged causal attention in plain torch: the exact (tiled) reference and the fast (SDPA) baseline."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lanes.batch import ForwardBatch

# Exact mode tiles. Keys are reduced in tiles of KEY_TILE absolute positions (0..63, 64..127, ...)
# and queries go through in tiles of QUERY_TILE rows, so every product has one shape and a query's
# sums run in an order fixed by its own position: prefill, decode and verify agree bitwise.
KEY_TILE = 64
QUERY_TILE = 16
# query tiles x key tiles per batched product: bounds the scores' memory on long prompts
_TILE_PAIRS = 256


def exact_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: ForwardBatch
) -> torch.Tensor:
    """q [num_tokens, num_heads, head_dim]; caches [num_slots, num_kv_heads, head_dim].

    Returns [num_tokens, num_heads, head_dim]. For each lane, all key tiles at once: per-tile
    products (one batched matmul of fixed-shape tiles), the softmax max over every visible key
    (exact in any order), per-tile sums of 64 keys, then the tiles added in ascending order:
    tiles past a query's position add exact zeros, so the bits do not depend on how far the
    context reaches beyond it. Two adds per key tile instead of a dozen calls (the online
    softmax per tile this replaced).
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
    rows = group * QUERY_TILE
    # [num_qtiles, num_kv_heads, rows, head_dim]; row = (head in group, query)
    q_t = (
        q.float()
        .view(num_qtiles, QUERY_TILE, num_kv_heads, group, head_dim)
        .permute(0, 2, 3, 1, 4)
        .reshape(num_qtiles, num_kv_heads, rows, head_dim)
    )
    q_pos_rows = q_pos.view(num_qtiles, 1, QUERY_TILE).expand(-1, group, -1).reshape(num_qtiles, -1)
    # keys in whole tiles; slots past the context repeat the first one and are always masked
    num_tiles = -(-context_len // KEY_TILE)
    pad_k = num_tiles * KEY_TILE - context_len
    slots = torch.cat([kv_slots, kv_slots[:1].expand(pad_k)]) if pad_k else kv_slots
    # index_select, not k_cache[slots]: the same copy, several times faster on the CPU
    k = k_cache.index_select(0, slots).float().view(num_tiles, KEY_TILE, num_kv_heads, head_dim)
    v = v_cache.index_select(0, slots).float().view(num_tiles, KEY_TILE, num_kv_heads, head_dim)
    k = k.permute(2, 0, 3, 1)  # [num_kv_heads, num_tiles, head_dim, KEY_TILE]
    v = v.permute(2, 0, 1, 3)  # [num_kv_heads, num_tiles, KEY_TILE, head_dim]
    key_pos = torch.arange(num_tiles * KEY_TILE, device=q.device).view(num_tiles, 1, KEY_TILE)
    o = torch.empty((num_qtiles, num_kv_heads, rows, head_dim), device=q.device)
    # query tiles in groups; each group reads the key tiles up to its last query's position
    step = max(1, _TILE_PAIRS // num_tiles)
    for first in range(0, num_qtiles, step):
        last = min(first + step, num_qtiles)
        top = first_position + min(last * QUERY_TILE, num_queries) - 1  # the group's last query
        reach = top // KEY_TILE + 1
        o[first:last] = _tiles(
            q_t[first:last], k[:, :reach], v[:, :reach], key_pos[:reach], q_pos_rows[first:last]
        )
    o = (
        o.view(num_qtiles, num_kv_heads, group, QUERY_TILE, head_dim)
        .permute(0, 3, 1, 2, 4)
        .reshape(num_qtiles * QUERY_TILE, num_heads, head_dim)
    )
    return o[:num_queries].to(q.dtype)


def _tiles(q_t, k, v, key_pos, q_pos_rows):
    """Attention of query tiles q_t [Q, HKV, rows, D] over key tiles k [HKV, T, D, KEY_TILE] and
    v [HKV, T, KEY_TILE, D] at positions key_pos [T, 1, KEY_TILE]; -> [Q, HKV, rows, D]."""
    scale = q_t.shape[-1] ** -0.5
    scores = torch.matmul(q_t.unsqueeze(2), k) * scale  # [Q, HKV, T, rows, KEY_TILE]
    visible = key_pos <= q_pos_rows.view(q_pos_rows.shape[0], 1, 1, -1, 1)  # [Q, 1, T, rows, K]
    scores = scores.masked_fill(~visible, float("-inf"))
    m = scores.amax(dim=(2, 4), keepdim=True)  # [Q, HKV, 1, rows, 1]: exact in any order
    p = torch.exp(scores - m)
    tile_denom = p.sum(dim=-1)  # [Q, HKV, T, rows]: each tile's 64 keys
    tile_acc = torch.matmul(p, v)  # [Q, HKV, T, rows, D]
    # over tiles in ascending order, one add each (a masked tile adds exact zeros)
    denom, acc = tile_denom[:, :, 0], tile_acc[:, :, 0]
    for t in range(1, tile_acc.shape[2]):
        denom = denom + tile_denom[:, :, t]
        acc = acc + tile_acc[:, :, t]
    return acc / denom.unsqueeze(-1)


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
