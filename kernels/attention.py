"""Paged causal attention for a flat batch of lanes: prefill chunks, decode and verify alike.

Each program takes BLOCK_Q queries of one lane and the GROUP query heads that share one KV head
(rows = query x head), and walks the lane's keys in tiles of BLOCK_N absolute positions
(0..63, 64..127, ...), in ascending order, with an online softmax in fp32. A tile entirely past a
row's position leaves that row's state unchanged bitwise, so a query gets the same bits whether
it is decoded alone, verified with drafts, or computed inside any prefill chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from lanes.kernels.common import check, interpreting

BLOCK_N = 64
BLOCK_ROWS = 64  # rows per program: BLOCK_Q queries x GROUP heads, padded to a power of two


@dataclass(frozen=True)
class AttentionMeta:
    """Per-lane layout of a forward, as device tensors (built once per forward)."""

    tile_seq: torch.Tensor  # [num_tiles] int32: lane of each query tile
    tile_q0: torch.Tensor  # [num_tiles] int32: first query (within the lane) of the tile
    q_start: torch.Tensor  # [num_seqs] int32: the lane's first row in the flat batch
    num_q: torch.Tensor  # [num_seqs] int32
    first_pos: torch.Tensor  # [num_seqs] int32: position of the lane's first query
    ctx_len: torch.Tensor  # [num_seqs] int32
    kv_off: torch.Tensor  # [num_seqs] int64: offset of the lane's slots in kv_slots
    kv_slots: torch.Tensor  # [sum ctx_len] int64: slot of every context position, lane by lane
    block_q: int


def block_q_for(group: int) -> int:
    return max(1, BLOCK_ROWS // triton.next_power_of_2(group))


def make_meta(seqs, group: int, device) -> AttentionMeta:
    """seqs: iterable of (query_start, num_queries, context_len, kv_slots tensor)."""
    bq = block_q_for(group)
    tile_seq, tile_q0, q_start, num_q, first_pos, ctx_len, kv_off, slots = (
        [],
        [],
        [],
        [],
        [],
        [],
        [],
        [],
    )
    off = 0
    for i, (qs, nq, cl, sl) in enumerate(seqs):
        for q0 in range(0, nq, bq):
            tile_seq.append(i)
            tile_q0.append(q0)
        q_start.append(qs)
        num_q.append(nq)
        first_pos.append(cl - nq)
        ctx_len.append(cl)
        kv_off.append(off)
        slots.append(sl)
        off += cl

    def i32(v):
        return torch.tensor(v, dtype=torch.int32, device=device)

    return AttentionMeta(
        tile_seq=i32(tile_seq),
        tile_q0=i32(tile_q0),
        q_start=i32(q_start),
        num_q=i32(num_q),
        first_pos=i32(first_pos),
        ctx_len=i32(ctx_len),
        kv_off=torch.tensor(kv_off, dtype=torch.int64, device=device),
        kv_slots=torch.cat(slots).to(device=device, dtype=torch.int64)
        if slots
        else torch.zeros(0, dtype=torch.int64, device=device),
        block_q=bq,
    )


@triton.jit
def _paged_attention_kernel(
    q_ptr,  # [T, HQ, D]
    k_cache_ptr,  # [S, HKV, D]
    v_cache_ptr,  # [S, HKV, D]
    out_ptr,  # [T, HQ, D]
    tile_seq_ptr,
    tile_q0_ptr,
    q_start_ptr,
    num_q_ptr,
    first_pos_ptr,
    ctx_len_ptr,
    kv_off_ptr,
    kv_slots_ptr,
    HQ,
    HKV,
    scale,
    GROUP: tl.constexpr,
    D: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr,
):
    tile = tl.program_id(0)
    kvh = tl.program_id(1)
    seq = tl.load(tile_seq_ptr + tile)
    q0 = tl.load(tile_q0_ptr + tile)
    q_start = tl.load(q_start_ptr + seq)
    num_q = tl.load(num_q_ptr + seq)
    first_pos = tl.load(first_pos_ptr + seq)
    ctx_len = tl.load(ctx_len_ptr + seq)
    kv_off = tl.load(kv_off_ptr + seq)

    r = tl.arange(0, BLOCK_R)
    qi = q0 + r // GROUP
    valid = (r < BLOCK_Q * GROUP) & (qi < num_q)
    qi = tl.minimum(qi, num_q - 1)  # padding rows repeat the last query: never fully masked
    head = kvh * GROUP + r % GROUP
    q_pos = first_pos + qi
    d = tl.arange(0, D)
    row_off = ((q_start + qi) * HQ + head) * D
    q = tl.load(q_ptr + row_off[:, None] + d[None, :], mask=valid[:, None], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)

    m = tl.full((BLOCK_R,), float("-inf"), dtype=tl.float32)
    denom = tl.zeros((BLOCK_R,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_R, D), dtype=tl.float32)
    last_pos = first_pos + tl.minimum(q0 + BLOCK_Q, num_q) - 1
    for start in range(0, last_pos + 1, BLOCK_N):
        kp = start + tl.arange(0, BLOCK_N)
        in_ctx = kp < ctx_len
        slots = tl.load(kv_slots_ptr + kv_off + kp, mask=in_ctx, other=0)
        kv_rows = (slots * HKV + kvh) * D
        k = tl.load(k_cache_ptr + kv_rows[:, None] + d[None, :], mask=in_ctx[:, None], other=0.0)
        v = tl.load(v_cache_ptr + kv_rows[:, None] + d[None, :], mask=in_ctx[:, None], other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        if UPCAST:  # fp32: a true fp32 product, no TF32
            s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale  # [BLOCK_R, BLOCK_N]
        else:
            s = tl.dot(q, tl.trans(k)) * scale
        visible = (kp[None, :] <= q_pos[:, None]) & in_ctx[None, :]
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        denom = denom * alpha + tl.sum(p, axis=1)
        if UPCAST:
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new
    out = acc / denom[:, None]
    tl.store(
        out_ptr + row_off[:, None] + d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=valid[:, None],
    )


def paged_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMeta
) -> torch.Tensor:
    """q [T, HQ, D]; caches [S, HKV, D] -> [T, HQ, D]."""
    check(
        q.dim() == 3 and k_cache.dim() == 3 and v_cache.shape == k_cache.shape,
        "q [T, HQ, D], caches [S, HKV, D]",
    )
    t, hq, d = q.shape
    hkv = k_cache.shape[1]
    check(
        hq % hkv == 0 and k_cache.shape[2] == d,
        f"heads {hq} over {hkv}, head_dim {d} vs {k_cache.shape[2]}",
    )
    check(
        d == triton.next_power_of_2(d) and d >= 16,
        f"head_dim must be a power of two >= 16, got {d}",
    )
    check(q.dtype == k_cache.dtype == v_cache.dtype, "q and caches share one dtype")
    check(
        q.is_contiguous() and k_cache.is_contiguous() and v_cache.is_contiguous(),
        "contiguous tensors only",
    )
    group = hq // hkv
    check(meta.block_q == block_q_for(group), "meta was built for another GQA group")
    out = torch.empty_like(q)
    num_tiles = meta.tile_seq.shape[0]
    if t and num_tiles:
        _paged_attention_kernel[(num_tiles, hkv)](
            q,
            k_cache,
            v_cache,
            out,
            meta.tile_seq,
            meta.tile_q0,
            meta.q_start,
            meta.num_q,
            meta.first_pos,
            meta.ctx_len,
            meta.kv_off,
            meta.kv_slots,
            hq,
            hkv,
            d**-0.5,
            GROUP=group,
            D=d,
            BLOCK_Q=meta.block_q,
            BLOCK_R=max(16, triton.next_power_of_2(meta.block_q * group)),
            BLOCK_N=BLOCK_N,
            UPCAST=interpreting() or q.dtype == torch.float32,
        )
    return out


def ref_paged_attention(q, k_cache, v_cache, seqs) -> torch.Tensor:
    """Plain softmax attention per lane over its gathered context, in fp32."""
    out = torch.empty_like(q)
    group = q.shape[1] // k_cache.shape[1]
    for qs, nq, cl, slots in seqs:
        k = k_cache[slots].float().repeat_interleave(group, dim=1).transpose(0, 1)  # [HQ, cl, D]
        v = v_cache[slots].float().repeat_interleave(group, dim=1).transpose(0, 1)
        qq = q[qs : qs + nq].float().transpose(0, 1)  # [HQ, nq, D]
        s = qq @ k.transpose(1, 2) * q.shape[2] ** -0.5
        pos = torch.arange(cl - nq, cl, device=q.device)
        s = s.masked_fill(torch.arange(cl, device=q.device)[None, :] > pos[:, None], float("-inf"))
        out[qs : qs + nq] = (torch.softmax(s, dim=-1) @ v).transpose(0, 1).to(q.dtype)
    return out
