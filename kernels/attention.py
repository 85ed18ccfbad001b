"""Paged causal attention for a flat batch of lanes: prefill chunks, decode and verify alike.

Each program takes BLOCK_Q queries of one lane and the GROUP query heads that share one KV head
(rows = query x head), and walks the lane's keys in tiles of BLOCK_N absolute positions
(0..127, 128..255, ...), in ascending order, with an online softmax in fp32 (base 2). A tile
entirely past a row's position leaves that row's state unchanged bitwise, so a query gets the
same bits whether it is decoded alone, verified with drafts, or computed inside any prefill
chunk. Tiles below the program's first query skip the causal mask (same bits: see _attend_tile);
long prompts take twice the rows per program; the last query tiles start first.

Key partitions (flash-decoding, with fixed bits): the tiles are grouped into partitions of
PART_TILES tiles at absolute positions; each partition's online softmax starts afresh, and the
partitions' states are merged in ascending order (`_merge`). A prefill program merges them in
registers as it walks; a forward with few programs over long contexts (decode, verify, or a
prompt chunk deep in a long prompt beside short decode lanes) computes the partitions in
parallel programs (the kernel's SPLIT form) and stores their states, and the last of a query
tile's programs to arrive (a ticket, as matmul's split-K) merges them in ascending order with the
same arithmetic, in the same launch. The kernels are compiled without fp fusion
(common.unfused_launch): each multiply and add rounds on its own unless the source says fma, so
the two routes give a row the same bits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lanes.kernels.common import (
    check,
    fp32_dot,
    interpreting,
    pdl_launch,
    tickets,
    unfused_launch,
    wait_for_inputs,
)
from lanes.kernels.triton_shim import tl, triton

# keys per tile: a row's bits depend on it (the online softmax rescales at every tile), so every
# forward of a model uses the same (key_tile). 128 ran prefill 1.3-1.4x faster than 64 on the
# H200 (bench_attention); heads of 256 (Qwen3.5) take 64, whose K and V tiles fit shared memory
BLOCK_N = 128
# tiles per key partition: a row's bits depend on it too. Long enough that a prefill program
# merges rarely, short enough that a decode step at a few thousand positions has enough programs
PART_TILES = 4
# a decode/verify forward with fewer (query tile, KV head) programs than this computes the
# partitions in parallel programs (about 2 per SM on the H200)
SPLIT_BELOW_PROGRAMS = 256
SPLIT_SCRATCH_BYTES = 64 << 20  # the partitions' states, per forward, at most
# A forward whose long-context tiles are few, beside short lanes (a prompt chunk of a few query
# tiles deep in a long prompt, beside decode rows), splits those tiles' partitions whatever the
# short lanes' programs, with a larger scratch (a 143-row forward at 32K needs 152 MB). H100, 8B
# heads, 32K context (bench.kernels.attention --chunks): a 16-query chunk 321 us split against
# 631 walked by one program per tile; 80 queries 546 against 612; 256 queries 1,174 against
# 608, so past a few tiles walking is faster.
FEW_LONG_PROGRAMS = 48
FEW_LONG_SCRATCH_BYTES = 384 << 20
LONG_SHARE = 4  # a lane whose context is over 1/LONG_SHARE of the longest is a long one
BLOCK_ROWS = 64  # rows per program: BLOCK_Q queries x GROUP heads, padded to a power of two
# long prompts: twice the rows per program (8 warps), so each key tile loaded serves more queries.
# A row's bits do not depend on how many rows share its tensor-core tile (checked on the H200:
# bench_attention's rows_equal_decode), so decode and prefill rows still agree.
WIDE_ROWS = 128
WIDE_STAGES = 3
WIDE_FROM_QUERIES = 512  # a forward with at least this many queries takes the wide tiles


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
    max_ctx: int  # the longest context any lane may have (graphs: their capacity)
    # query tiles of the lanes with long contexts (-1: every tile): what the split decision counts
    long_tiles: int = -1


def key_tile(head_dim: int) -> int:
    """Keys per tile for this head size (a model's forwards all use the same)."""
    return BLOCK_N if head_dim <= 128 else 64


def block_q_for(group: int, rows: int = BLOCK_ROWS) -> int:
    return max(1, rows // triton.next_power_of_2(group))


def rows_for(num_queries: int, dtype: torch.dtype, device, head_dim: int = 128) -> int:
    """Rows per program for a forward of this many queries: wide tiles for long prompts on a GPU
    in bf16/fp16 with heads of at most 128; fp32 products (FMA loops whose order follows the
    tile) and the CPU interpreter (whose numpy matmul rounds a row by its place in the tile)
    keep one shape."""
    wide = (
        num_queries >= WIDE_FROM_QUERIES
        and head_dim <= 128
        and dtype != torch.float32
        and torch.device(device).type == "cuda"
        and not interpreting()
    )
    return WIDE_ROWS if wide else BLOCK_ROWS


def make_meta(seqs, group: int, device, rows: int = BLOCK_ROWS) -> AttentionMeta:
    """seqs: iterable of (query_start, num_queries, context_len, kv_slots tensor); rows: rows per
    program (rows_for)."""
    bq = block_q_for(group, rows)
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
    seqs = list(seqs)
    longest = max((cl for _, _, cl, _ in seqs), default=0)
    long_tiles = 0
    for i, (qs, nq, cl, sl) in enumerate(seqs):
        for q0 in range(0, nq, bq):
            tile_seq.append(i)
            tile_q0.append(q0)
        if cl * LONG_SHARE > longest:
            long_tiles += -(-nq // bq)
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
        max_ctx=max(ctx_len, default=0),
        long_tiles=long_tiles,
    )


@triton.jit
def _attend_tile(
    q,
    m,
    denom,
    acc,
    start,
    kv_slots_ptr,
    kv_off,
    ctx_len,
    k_cache_ptr,
    v_cache_ptr,
    kvh,
    HKV,
    q_pos,
    qk_scale,
    d,
    D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr,
    MASKED: tl.constexpr,
):
    """One key tile's step of the online softmax, in base 2 (qk_scale = log2(e) / sqrt(D), m in
    scaled units). MASKED = False only where every key of the tile is in the context and visible
    to every row. The mask is applied to the raw scores and the scaling is one explicit fma in
    both kinds of tile, so a row's bits do not depend on which kind a tile was for its program
    (left to the compiler, `s * scale - m` fused into an fma only where no mask came between)."""
    kp = start + tl.arange(0, BLOCK_N)
    if MASKED:
        in_ctx = kp < ctx_len
        slots = tl.load(kv_slots_ptr + kv_off + kp, mask=in_ctx, other=0)
    else:
        slots = tl.load(kv_slots_ptr + kv_off + kp)
    kv_rows = (slots * HKV + kvh) * D
    if MASKED:
        k = tl.load(k_cache_ptr + kv_rows[:, None] + d[None, :], mask=in_ctx[:, None], other=0.0)
        v = tl.load(v_cache_ptr + kv_rows[:, None] + d[None, :], mask=in_ctx[:, None], other=0.0)
    else:
        k = tl.load(k_cache_ptr + kv_rows[:, None] + d[None, :])
        v = tl.load(v_cache_ptr + kv_rows[:, None] + d[None, :])
    if UPCAST:  # fp32: a true fp32 product, no TF32
        zero = tl.zeros((q.shape[0], BLOCK_N), dtype=tl.float32)
        s = fp32_dot(q, tl.trans(k.to(tl.float32)), zero, UPCAST == 2)
    else:
        s = tl.dot(q, tl.trans(k))  # [BLOCK_R, BLOCK_N]
    if MASKED:
        visible = (kp[None, :] <= q_pos[:, None]) & in_ctx[None, :]
        s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, axis=1) * qk_scale)
    alpha = tl.exp2(m - m_new)
    p = tl.exp2(tl.fma(s, qk_scale, -m_new[:, None]))
    denom = denom * alpha + tl.sum(p, axis=1)
    # Triton folds the add into the product's accumulator: dot(p, v, acc * alpha)
    if UPCAST:
        acc = fp32_dot(p, v.to(tl.float32), acc * alpha[:, None], UPCAST == 2)
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, denom, acc


@triton.jit
def _fresh(BLOCK_R: tl.constexpr, D: tl.constexpr):
    """The online softmax's empty state: max -inf, sum 0, output 0."""
    m = tl.full((BLOCK_R,), float("-inf"), dtype=tl.float32)
    return m, tl.zeros((BLOCK_R,), dtype=tl.float32), tl.zeros((BLOCK_R, D), dtype=tl.float32)


@triton.jit
def _partition(
    q, p0, p_end, full_end, kv_slots_ptr, kv_off, ctx_len, k_cache_ptr, v_cache_ptr, kvh, HKV,
    q_pos, qk_scale, d, BLOCK_R: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr,
):  # fmt: skip
    """The online softmax over the key tiles [p0, p_end) from a fresh state: (max in scaled
    units, sum of exponentials, unnormalised output). Tiles below full_end are unmasked."""
    m, denom, acc = _fresh(BLOCK_R, D)
    for start in range(p0, tl.minimum(p_end, full_end), BLOCK_N):
        m, denom, acc = _attend_tile(
            q, m, denom, acc, start, kv_slots_ptr, kv_off, ctx_len, k_cache_ptr, v_cache_ptr,
            kvh, HKV, q_pos, qk_scale, d, D, BLOCK_N, UPCAST, False,
        )  # fmt: skip
    for start in range(tl.maximum(p0, full_end), p_end, BLOCK_N):
        m, denom, acc = _attend_tile(
            q, m, denom, acc, start, kv_slots_ptr, kv_off, ctx_len, k_cache_ptr, v_cache_ptr,
            kvh, HKV, q_pos, qk_scale, d, D, BLOCK_N, UPCAST, True,
        )  # fmt: skip
    return m, denom, acc


@triton.jit
def _merge(m, denom, acc, m_p, denom_p, acc_p, use):
    """Merge a partition's state into the running one, for rows where `use` (the partition
    starts at or before the row's position, so it has a visible key); other rows keep theirs.
    From the empty state (-inf, 0, 0) the first merge gives the partition's own state exactly."""
    m_new = tl.where(use, tl.maximum(m, m_p), m)
    alpha = tl.exp2(m - m_new)
    beta = tl.exp2(m_p - m_new)
    denom = tl.where(use, tl.fma(denom, alpha, denom_p * beta), denom)
    acc = tl.where(use[:, None], tl.fma(acc, alpha[:, None], acc_p * beta[:, None]), acc)
    return m_new, denom, acc


@triton.jit
def _stored_partitions_merged(
    part_m_ptr, part_denom_ptr, part_acc_ptr, part_row, num_parts, q_pos, valid, d,
    BLOCK_R: tl.constexpr, D: tl.constexpr, PART: tl.constexpr,
):  # fmt: skip
    """The SPLIT form's merge: the rows' stored partition states in ascending order, as a
    prefill program merges them in registers. Read past L1 (`.cg`): other programs wrote them."""
    m, denom, acc = _fresh(BLOCK_R, D)
    for part in range(0, num_parts):
        use = valid & (part * PART <= q_pos)
        at = part_row + part
        m_p = tl.load(part_m_ptr + at, mask=use, other=float("-inf"), cache_modifier=".cg")
        denom_p = tl.load(part_denom_ptr + at, mask=use, other=0.0, cache_modifier=".cg")
        acc_p = tl.load(
            part_acc_ptr + at[:, None] * D + d[None, :],
            mask=use[:, None],
            other=0.0,
            cache_modifier=".cg",
        )
        m, denom, acc = _merge(m, denom, acc, m_p, denom_p, acc_p, use)
    return m, denom, acc


@triton.jit
def _walk_tile(
    m_all, denom_all, acc_all, q, m, denom, acc, start, kv_slots_ptr, kv_off, ctx_len,
    k_cache_ptr, v_cache_ptr, kvh, HKV, q_pos, qk_scale, d, BLOCK_R: tl.constexpr,
    D: tl.constexpr, BLOCK_N: tl.constexpr, PART: tl.constexpr, UPCAST: tl.constexpr,
    MASKED: tl.constexpr,
):  # fmt: skip
    """A prefill program's step: at a partition's first tile (but the first) the partition just
    completed is merged into the *_all state and the running state starts afresh; then the
    tile."""
    if (start % PART == 0) & (start > 0):
        m_all, denom_all, acc_all = _merge(
            m_all, denom_all, acc_all, m, denom, acc, start - PART <= q_pos
        )
        m, denom, acc = _fresh(BLOCK_R, D)
    m, denom, acc = _attend_tile(
        q, m, denom, acc, start, kv_slots_ptr, kv_off, ctx_len, k_cache_ptr, v_cache_ptr,
        kvh, HKV, q_pos, qk_scale, d, D, BLOCK_N, UPCAST, MASKED,
    )  # fmt: skip
    return m_all, denom_all, acc_all, m, denom, acc


@triton.jit
def _tile_rows(
    tile, kvh, tile_seq_ptr, tile_q0_ptr, q_start_ptr, num_q_ptr, first_pos_ptr, HQ,
    GROUP: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_R: tl.constexpr,
):  # fmt: skip
    """A program's query tile: its lane, the positions of its first and last queries, and per
    row (query x head of the GQA group) the (token, head) index in the flat batch, whether it is
    real, and its position. Padding rows repeat the last query, so no row is ever fully
    masked."""
    seq = tl.load(tile_seq_ptr + tile)
    q0 = tl.load(tile_q0_ptr + tile)
    q_start = tl.load(q_start_ptr + seq)
    num_q = tl.load(num_q_ptr + seq)
    first_pos = tl.load(first_pos_ptr + seq)
    r = tl.arange(0, BLOCK_R)
    qi = q0 + r // GROUP
    valid = (r < BLOCK_Q * GROUP) & (qi < num_q)
    qi = tl.minimum(qi, num_q - 1)
    head = kvh * GROUP + r % GROUP
    last_pos = first_pos + tl.minimum(q0 + BLOCK_Q, num_q) - 1
    return seq, first_pos + q0, last_pos, (q_start + qi) * HQ + head, valid, first_pos + qi


@triton.jit
def _queries(q_ptr, row, d, D: tl.constexpr, valid, UPCAST: tl.constexpr):
    """The tile's query rows (fp32 where the products are)."""
    q = tl.load(q_ptr + (row * D)[:, None] + d[None, :], mask=valid[:, None], other=0.0)
    return q.to(tl.float32) if UPCAST else q


@triton.jit
def _store_normalised(out_ptr, row, d, D: tl.constexpr, acc, denom, valid):
    """The softmax's output for real rows: acc / denom, in out's dtype."""
    out = acc / denom[:, None]
    tl.store(
        out_ptr + (row * D)[:, None] + d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=valid[:, None],
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
    max_parts,  # SPLIT: partitions per row in the scratch
    part_m_ptr,  # SPLIT: [T, HQ, max_parts] float32, each partition's max (scaled units)
    part_denom_ptr,  # SPLIT: [T, HQ, max_parts] float32, its sum of exponentials
    part_acc_ptr,  # SPLIT: [T, HQ, max_parts, D] float32, its unnormalised output
    ticket_ptr,  # SPLIT: [query tiles x HKV] int32 arrival counters, zero between launches
    HQ,
    HKV,
    qk_scale,  # log2(e) / sqrt(D)
    GROUP: tl.constexpr,
    D: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PART_TILES: tl.constexpr,
    SPLIT: tl.constexpr,
    UPCAST: tl.constexpr,
    PDL: tl.constexpr,
):
    # the last query tiles (the longest causal rows) first, so the long ones do not trail
    tile = tl.num_programs(0) - 1 - tl.program_id(0)
    kvh = tl.program_id(1)
    # the forward's layout is written before its first kernel (graphs: before the replay; eager:
    # copied in just before layer 0's launch), never by the kernel this one may overlap under
    # PDL, so it is read before waiting for that kernel's outputs (q, the new keys and values)
    seq, first_q_pos, last_pos, row, valid, q_pos = _tile_rows(
        tile, kvh, tile_seq_ptr, tile_q0_ptr, q_start_ptr, num_q_ptr, first_pos_ptr, HQ, GROUP,
        BLOCK_Q, BLOCK_R,
    )  # fmt: skip
    ctx_len = tl.load(ctx_len_ptr + seq)
    kv_off = tl.load(kv_off_ptr + seq)
    wait_for_inputs(PDL)
    d = tl.arange(0, D)

    # key tiles every row sees whole (below the tile's first query), then the rest up to its last
    full_end = (first_q_pos + 1) // BLOCK_N * BLOCK_N
    PART: tl.constexpr = PART_TILES * BLOCK_N
    if SPLIT:  # partitions j, j + splits, ...: each state stored, or the output if only one
        num_parts = last_pos // PART + 1
        part_row = row * max_parts
        first = tl.program_id(2)
        # a graph's launch has programs for its capacity's partitions: most have none to do
        if first < num_parts:
            q = _queries(q_ptr, row, d, D, valid, UPCAST)
            for part in range(first, num_parts, tl.num_programs(2)):
                p0 = part * PART
                m_p, denom_p, acc_p = _partition(
                    q, p0, tl.minimum(p0 + PART, last_pos + 1), full_end, kv_slots_ptr, kv_off,
                    ctx_len, k_cache_ptr, v_cache_ptr, kvh, HKV, q_pos, qk_scale, d, BLOCK_R, D,
                    BLOCK_N, UPCAST,
                )  # fmt: skip
                if num_parts == 1:
                    _store_normalised(out_ptr, row, d, D, acc_p, denom_p, valid)
                else:
                    keep = valid & (p0 <= q_pos)
                    tl.store(part_m_ptr + part_row + part, m_p, mask=keep)
                    tl.store(part_denom_ptr + part_row + part, denom_p, mask=keep)
                    tl.store(
                        part_acc_ptr + (part_row + part)[:, None] * D + d[None, :],
                        acc_p,
                        mask=keep[:, None],
                    )
            if num_parts > 1:
                # as matmul's split-K: every thread's stores done (the barrier) before the arrival
                # is counted with release semantics; the last of the tile's working programs to
                # arrive acquires, so it sees every partition, and merges them in ascending order
                tl.debug_barrier()
                counter = ticket_ptr + tile * tl.num_programs(1) + kvh
                arrived = tl.atomic_add(counter, 1, sem="acq_rel")
                if arrived == tl.minimum(num_parts, tl.num_programs(2)) - 1:
                    m, denom, acc = _stored_partitions_merged(
                        part_m_ptr, part_denom_ptr, part_acc_ptr, part_row, num_parts, q_pos,
                        valid, d, BLOCK_R, D, PART,
                    )  # fmt: skip
                    tl.atomic_xchg(counter, 0)
                    _store_normalised(out_ptr, row, d, D, acc, denom, valid)
    else:  # one walk over the tiles; at each partition's end its state is merged and reset
        q = _queries(q_ptr, row, d, D, valid, UPCAST)
        m, denom, acc = _fresh(BLOCK_R, D)
        m_all, denom_all, acc_all = _fresh(BLOCK_R, D)
        for start in range(0, full_end, BLOCK_N):
            m_all, denom_all, acc_all, m, denom, acc = _walk_tile(
                m_all, denom_all, acc_all, q, m, denom, acc, start, kv_slots_ptr, kv_off,
                ctx_len, k_cache_ptr, v_cache_ptr, kvh, HKV, q_pos, qk_scale, d, BLOCK_R, D,
                BLOCK_N, PART, UPCAST, False,
            )  # fmt: skip
        for start in range(full_end, last_pos + 1, BLOCK_N):
            m_all, denom_all, acc_all, m, denom, acc = _walk_tile(
                m_all, denom_all, acc_all, q, m, denom, acc, start, kv_slots_ptr, kv_off,
                ctx_len, k_cache_ptr, v_cache_ptr, kvh, HKV, q_pos, qk_scale, d, BLOCK_R, D,
                BLOCK_N, PART, UPCAST, True,
            )  # fmt: skip
        last_p0 = last_pos // PART * PART
        m_all, denom_all, acc_all = _merge(
            m_all, denom_all, acc_all, m, denom, acc, last_p0 <= q_pos
        )
        _store_normalised(out_ptr, row, d, D, acc_all, denom_all, valid)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMeta,
    num_stages: int | None = None,
    block_n: int | None = None,
    part_tiles: int = PART_TILES,
    split: bool | None = None,
) -> torch.Tensor:
    """q [T, HQ, D]; caches [S, HKV, D] -> [T, HQ, D]. split: compute the key partitions in
    parallel programs, the last to finish merging them (same bits); by default where the
    forward has few programs and partitions to split. For experiments and tests: num_stages,
    the key tiles' pipeline depth (Triton's default unless given); block_n and part_tiles, the
    key tile and the tiles per partition (a row's bits depend on both: every forward of an
    engine must use the same)."""
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
        d == triton.next_power_of_2(d) and 16 <= d <= 256,
        f"head_dim must be a power of two in 16..256, got {d}",
    )
    check(q.dtype == k_cache.dtype == v_cache.dtype, "q and caches share one dtype")
    check(
        q.is_contiguous() and k_cache.is_contiguous() and v_cache.is_contiguous(),
        "contiguous tensors only",
    )
    group = hq // hkv
    check(
        meta.block_q in (block_q_for(group), block_q_for(group, WIDE_ROWS)),
        "meta was built for another GQA group",
    )
    block_n = key_tile(d) if block_n is None else block_n
    out = torch.empty_like(q)
    num_tiles = meta.tile_seq.shape[0]
    block_r = max(16, triton.next_power_of_2(meta.block_q * group))
    check(block_r < WIDE_ROWS or d <= 128, "wide tiles are for heads of at most 128")
    max_parts = max(1, triton.cdiv(meta.max_ctx, part_tiles * block_n))
    scratch_bytes = t * hq * max_parts * (d + 2) * 4
    # the programs that walk long key ranges: where they are few, their partitions are split
    long_programs = max(1, (num_tiles if meta.long_tiles < 0 else meta.long_tiles) * hkv)
    if split is None:
        few_programs = num_tiles * hkv < SPLIT_BELOW_PROGRAMS
        split = (
            max_parts > 1
            and block_r < WIDE_ROWS
            and (
                (few_programs and scratch_bytes <= SPLIT_SCRATCH_BYTES)
                or (long_programs <= FEW_LONG_PROGRAMS and scratch_bytes <= FEW_LONG_SCRATCH_BYTES)
            )
        )
    if not (t and num_tiles):
        return out
    f32 = dict(dtype=torch.float32, device=q.device)
    if split:
        part_m = torch.empty(t * hq * max_parts, **f32)
        part_denom = torch.empty(t * hq * max_parts, **f32)
        part_acc = torch.empty(t * hq * max_parts * d, **f32)
        splits = min(max_parts, triton.cdiv(2 * SPLIT_BELOW_PROGRAMS, long_programs))
    else:
        part_m = part_denom = part_acc = torch.empty(0, **f32)
        splits = 1
    # asked on every call, so the first forward on a device (eager, before any graph) makes them
    counters = tickets(q.device, num_tiles * hkv if split else 0, "attention")
    shape = dict(GROUP=group, D=d, BLOCK_Q=meta.block_q, BLOCK_R=block_r, BLOCK_N=block_n)
    _paged_attention_kernel[(num_tiles, hkv, splits)](
        q, k_cache, v_cache, out, meta.tile_seq, meta.tile_q0, meta.q_start, meta.num_q,
        meta.first_pos, meta.ctx_len, meta.kv_off, meta.kv_slots, max_parts, part_m,
        part_denom, part_acc, counters, hq, hkv,
        d**-0.5 * 1.4426950408889634,  # log2(e): the softmax runs in base 2
        **shape, PART_TILES=part_tiles, SPLIT=split,
        UPCAST=_upcast(q.dtype),
        **_launch(block_r, d, num_stages), **pdl_launch(q.device), **unfused_launch(),
    )  # fmt: skip
    return out


def _upcast(dtype: torch.dtype) -> int:
    """The kernel's products: 0 on tensor cores in the model dtype, 1 in true fp32 (fp32
    models), 2 in fp32 on the CPU interpreter, row by row (common.fp32_dot)."""
    return 2 if interpreting() else int(dtype == torch.float32)


def _launch(block_r: int, head_dim: int, num_stages: int | None) -> dict:
    """Warps and pipeline stages: wide tiles take 8 warps and WIDE_STAGES (H200,
    bench_attention: results/prefill-h200/call2); heads of 256 two stages (three did not fit
    the H200's shared memory)."""
    if block_r >= WIDE_ROWS:
        return {"num_warps": 8, "num_stages": WIDE_STAGES if num_stages is None else num_stages}
    if num_stages is None and head_dim > 128:
        num_stages = 2
    return {"num_warps": 4} if num_stages is None else {"num_warps": 4, "num_stages": num_stages}


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
