"""The gated delta rule in chunks anchored at absolute positions: the recurrence of
kernels/delta_rule.py (same layer, same inputs) computed a chunk of CHUNK rows at a time with
matrix products, for prompt work at tensor speed (issue 45 item 1), in plain torch
(`ref_chunked_gated_delta`) and as Triton kernels (`chunked_gated_delta`).

A lane's positions fall in chunks [c * CHUNK, (c + 1) * CHUNK). Within one, from the state S
after the previous chunk (S [dk, dv] per value head), with per-row log decays g_t <= 0, their
running sums G_t from the chunk's first row, gamma_t = exp(G_t), and t, i rows of the chunk:

    A[t, i] = beta_t exp(G_t - G_i) (k_t . k_i)          i < t   (strictly lower)
    W = (I + A)^-1 (beta gamma * K),   U = (I + A)^-1 (beta * V)
    D = U - W S                                           the rows' deltas (S's updates)
    O = (gamma * Q) S + P D,            P[t, i] = exp(G_t - G_i) (q_t . k_i),   i <= t
    S' = gamma_last S + (exp(G_last - G) * K)^T D         the state after the chunk

(Unrolling S_t = a_t S_{t-1} + k_t d_t^T, d_t = beta_t (v_t - a_t S_{t-1}^T k_t) over the chunk
gives (I + A) D = beta (V - gamma K S); the kernels invert I + A by blocked forward
substitution.)

Exactness, the reason for the anchoring: a row's output depends on its chunk's start state and
on the rows from the chunk's start to itself, through arithmetic whose shapes are fixed
(CHUNK rows, padding rows zero), never on where a forward's rows begin or end. So a lane that
reaches a position through one prompt chunk, several, a cache hit at a chunk boundary, decode
one row at a time, or verify rows gets the same bits there. The price: a forward that starts
inside a chunk recomputes that chunk's earlier rows, which the lane carries between forwards
(`ChunkCarry`: the state at its current chunk's start and that chunk's rows so far); a decode
row costs one chunk's work. These bits are not those of the row-by-row recurrence (another
summation order: equal to ~1e-5 in float32), so a lane's rows must all take this form.

Kernels: one program per block of rows and value head for the rows' features (the conv, norms,
beta, g), one per chunk and value head for the chunk's matrices (parallel over chunks: nothing
there reads S), one per value head and block of value columns walking the chunks in order (two
products a chunk: D and the next S; each chunk's start state and D are stored), one per chunk,
value head and block of value columns for the outputs, then the gated RMSNorm of
kernels/delta_rule.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from lanes.kernels.common import check, conv_window_after, fp32_dot, interpreting, unfused_launch
from lanes.kernels.delta_rule import (
    L2_EPS,
    DeltaRuleWeights,
    _gated_norm_kernel,
    _gated_rms_norm,
)
from lanes.kernels.triton_shim import tl, triton

# rows per chunk: part of the arithmetic (a row's bits depend on it), so fixed for every model
CHUNK = 64
_BLOCK_T = 16  # rows per features program
_BLOCK_V = 32  # value columns of S per scan program, as the recurrent kernel's
_WARPS = 4
TF32 = False  # the chunk products in TF32 on the GPU (bench.kernels delta-layer compares)


@dataclass(frozen=True)
class ChunkCarry:
    """One lane's recurrence between forwards: its conv window, the state at the start of the
    chunk holding its next position, and that chunk's rows so far (position % CHUNK of them;
    the rest zero), float32."""

    conv: torch.Tensor  # [conv_dim, kernel - 1]: the inputs before the next row
    state: torch.Tensor  # [value_heads, dk, dv]: S after the last whole chunk
    k: torch.Tensor  # [CHUNK, value_heads, dk]: normalised keys, one per value head
    v: torch.Tensor  # [CHUNK, value_heads, dv]
    beta: torch.Tensor  # [CHUNK, value_heads]
    g: torch.Tensor  # [CHUNK, value_heads]: log decays
    position: int  # rows the lane has computed

    @staticmethod
    def start(conv: torch.Tensor, state: torch.Tensor, position: int = 0) -> ChunkCarry:
        """The carry at a chunk boundary: the state there (from a snapshot, or zeros)."""
        check(position % CHUNK == 0, f"a carry starts at a multiple of {CHUNK}, not {position}")
        hv, dk, dv = state.shape
        rows = lambda *shape: torch.zeros(  # noqa: E731
            (CHUNK, hv, *shape), dtype=torch.float32, device=state.device
        )
        return ChunkCarry(conv, state, rows(dk), rows(dv), rows(), rows(), position)

    @property
    def num_partial(self) -> int:
        return self.position % CHUNK


def ref_features(mixed, b, a, conv, w: DeltaRuleWeights):
    """(q, k [T, value_heads, dk], v [T, value_heads, dv], beta, g [T, value_heads]), float32:
    the conv, silu, norms and gates of each row, as kernels/delta_rule.delta_rule_steps has them."""
    hk, hv, dk, dv = w.key_heads, w.value_heads, w.key_dim, w.value_dim
    t, kernel = mixed.shape[0], w.taps.shape[1]
    window = torch.cat([conv, mixed.float().T], dim=1)  # [conv_dim, kernel - 1 + T]
    taps = window.unfold(1, kernel, 1)  # [conv_dim, T, kernel]
    qkv = F.silu((taps * w.taps[:, None, :]).sum(dim=2)).T  # [T, conv_dim]
    q, k, v = qkv.split([hk * dk, hk * dk, hv * dv], dim=1)
    q, k = (_l2(x.reshape(t, hk, dk)).repeat_interleave(hv // hk, 1) for x in (q, k))
    beta = torch.sigmoid(b.float())
    g = w.neg_a * F.softplus(a.float() + w.dt_bias)
    return q * dk**-0.5, k, v.reshape(t, hv, dv), beta, g


def _l2(x):
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + L2_EPS)


def span_rows(carry: ChunkCarry, q, k, v, beta, g):
    """The rows from the carry's chunk start to the last new row, padded with zero rows to
    whole chunks: (q, k, v, beta, g), float32. q is zero on the carried rows, whose outputs
    were given by an earlier forward."""
    n, pad = carry.num_partial, -(carry.num_partial + q.shape[0]) % CHUNK
    carried = (torch.zeros_like(carry.k), carry.k, carry.v, carry.beta, carry.g)
    return tuple(
        torch.cat([old[:n], x.float(), x.new_zeros((pad, *x.shape[1:]))])
        for old, x in zip(carried, (q, k, v, beta, g), strict=True)
    )


def _carry_after(carry: ChunkCarry, mixed, span, state) -> ChunkCarry:
    """The carry after the new rows: `state` is S after the span's whole chunks."""
    _, k, v, beta, g = span
    end = carry.num_partial + mixed.shape[0]
    last, count = end - end % CHUNK, end % CHUNK

    def rows(x):
        kept = torch.zeros((CHUNK, *x.shape[1:]), dtype=x.dtype, device=x.device)
        kept[:count] = x[last:end]
        return kept

    return ChunkCarry(
        conv_window_after(carry.conv, mixed), state, rows(k), rows(v), rows(beta), rows(g),
        carry.position + mixed.shape[0],
    )  # fmt: skip


def ref_chunked_gated_delta(mixed, z, b, a, carry: ChunkCarry, w: DeltaRuleWeights):
    """(out [T, value_heads, dv] in the model dtype, or None without z; the carry after the
    rows), chunk by chunk in torch."""
    n, t = carry.num_partial, mixed.shape[0]
    if not t:
        return (
            None
            if z is None
            else mixed.new_empty((0, w.value_heads, w.value_dim), dtype=w.norm.dtype)
        ), carry
    span = span_rows(carry, *ref_features(mixed, b, a, carry.conv, w))
    q, k, v, beta, g = span
    whole = (n + t) // CHUNK
    r = torch.arange(CHUNK, device=mixed.device)
    strict, incl = r[:, None] > r[None, :], r[:, None] >= r[None, :]
    state, outs = carry.state, []
    for c in range(q.shape[0] // CHUNK):
        rows = slice(c * CHUNK, (c + 1) * CHUNK)
        qc, kc, vc = (x[rows].transpose(0, 1) for x in (q, k, v))  # [hv, C, d]
        bc, G = beta[rows].T, g[rows].T.cumsum(dim=1)  # [hv, C]
        decay = torch.where(incl, G[:, :, None] - G[:, None, :], -torch.inf).exp()  # [hv, C, C]
        A = torch.where(strict, bc[:, :, None] * decay * (kc @ kc.transpose(1, 2)), 0.0)
        eye = torch.eye(CHUNK, device=mixed.device).expand_as(A)
        inv = torch.linalg.solve_triangular(eye + A, eye, upper=False, unitriangular=True)
        gamma = torch.exp(G)
        W = inv @ (kc * (bc * gamma)[:, :, None])
        U = inv @ (vc * bc[:, :, None])
        D = U - W @ state
        outs.append((qc * gamma[:, :, None]) @ state + (decay * (qc @ kc.transpose(1, 2))) @ D)
        if c < whole:
            last = G[:, -1:]
            kept = kc * torch.exp(last - G)[:, :, None]
            state = torch.exp(last)[:, :, None] * state + kept.transpose(1, 2) @ D
    o = torch.cat(outs, dim=1).transpose(0, 1)[n : n + t]  # [T, hv, dv]
    out = None
    if z is not None:
        hv, dv = w.value_heads, w.value_dim
        out = torch.empty((t, hv, dv), dtype=w.norm.dtype, device=mixed.device)
        for i in range(t):
            out[i] = _gated_rms_norm(o[i], z[i].view(hv, dv), w.norm, w.eps)
    return out, _carry_after(carry, mixed, span, state)


@triton.jit
def _conv_rows(mixed_ptr, conv_ptr, taps_ptr, ch, t, T, stride_m, KERNEL: tl.constexpr):
    """silu of the causal conv at rows t [BLOCK_T] for channels ch [D]: taps summed in order,
    the inputs before row 0 from the conv window."""
    acc = tl.zeros((t.shape[0], ch.shape[0]), dtype=tl.float32)
    for i in tl.static_range(KERNEL):
        p = t - (KERNEL - 1) + i  # the input's row; < 0: in the window
        in_rows = ((p >= 0) & (t < T))[:, None]
        x = tl.load(mixed_ptr + p[:, None] * stride_m + ch[None, :], mask=in_rows, other=0.0)
        window = conv_ptr + ch[None, :] * (KERNEL - 1) + (p + KERNEL - 1)[:, None]
        x = tl.where(in_rows, x.to(tl.float32), tl.load(window, mask=(p < 0)[:, None], other=0.0))
        acc = acc + x * tl.load(taps_ptr + ch * KERNEL + i)[None, :]
    return acc * tl.sigmoid(acc)


@triton.jit
def _features_kernel(
    mixed_ptr,  # [T, conv_dim] model dtype, rows stride_m apart
    b_ptr,  # [T, HV] rows stride_b apart
    a_ptr,  # [T, HV] rows stride_a apart
    conv_ptr,  # [conv_dim, KERNEL - 1] float32: the inputs before row 0
    taps_ptr,  # [conv_dim, KERNEL] float32
    neg_a_ptr,  # [HV] float32
    dt_bias_ptr,  # [HV] float32
    q_ptr,  # [T, HV, DK] float32
    k_ptr,  # [T, HV, DK] float32
    v_ptr,  # [T, HV, DV] float32
    beta_ptr,  # [T, HV] float32
    g_ptr,  # [T, HV] float32
    T,
    stride_m,
    stride_b,
    stride_a,
    q_scale,
    l2_eps,
    HK: tl.constexpr,
    HV: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    KERNEL: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    """One (block of rows, value head): each row's conv outputs, norms and gates; every
    operation is within a row, so a row's bits do not depend on the block it sits in."""
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    h = tl.program_id(1)
    kh = h // (HV // HK)
    dk = tl.arange(0, DK)
    dv = tl.arange(0, DV)
    q = _conv_rows(mixed_ptr, conv_ptr, taps_ptr, kh * DK + dk, t, T, stride_m, KERNEL)
    k = _conv_rows(mixed_ptr, conv_ptr, taps_ptr, HK * DK + kh * DK + dk, t, T, stride_m, KERNEL)
    v_ch = 2 * HK * DK + h * DV + dv
    v = _conv_rows(mixed_ptr, conv_ptr, taps_ptr, v_ch, t, T, stride_m, KERNEL)
    q = q * tl.rsqrt(tl.sum(q * q, axis=1) + l2_eps)[:, None] * q_scale
    k = k * tl.rsqrt(tl.sum(k * k, axis=1) + l2_eps)[:, None]
    valid = t < T
    x = tl.load(a_ptr + t * stride_a + h, mask=valid).to(tl.float32) + tl.load(dt_bias_ptr + h)
    softplus = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(x)))  # torch's threshold
    beta = tl.sigmoid(tl.load(b_ptr + t * stride_b + h, mask=valid).to(tl.float32))
    row = t * HV + h
    tl.store(q_ptr + row[:, None] * DK + dk[None, :], q, mask=valid[:, None])
    tl.store(k_ptr + row[:, None] * DK + dk[None, :], k, mask=valid[:, None])
    tl.store(v_ptr + row[:, None] * DV + dv[None, :], v, mask=valid[:, None])
    tl.store(beta_ptr + row, beta, mask=valid)
    tl.store(g_ptr + row, tl.load(neg_a_ptr + h) * softplus, mask=valid)


@triton.jit
def _dot(a, b, acc, ROW_STABLE: tl.constexpr, TF32: tl.constexpr):
    """acc + a @ b: true fp32 (fp32_dot), or on the GPU with TF32 the tensor cores' float32
    mode (fixed per shape too, so a row's bits stay independent of the other rows)."""
    if TF32 and not ROW_STABLE:
        return tl.dot(a, b, acc, input_precision="tf32")
    else:
        return fp32_dot(a, b, acc, ROW_STABLE)


@triton.jit
def _unit_lower_inverse(A, r, C: tl.constexpr, ROW_STABLE: tl.constexpr, TF32: tl.constexpr):
    """(I + A)^-1 for a strictly lower A [C, C], in four diagonal blocks of C // 4 rows: the
    blocks' own inverses M by forward substitution, the i-th rows of all four blocks at once
    (row = e - A M: its block's earlier rows are final), then the block rows of the inverse in
    order, X_b = M_b (E_b - A_{b,<b} X_{<b}). C // 4 + 5 products in a chain where a row at a
    time took C steps. Row t reads only rows up to t (the rest enter as exact zeros), in
    arithmetic of one shape: the anchoring's bits."""
    B: tl.constexpr = C // 4
    eye = tl.where(r[:, None] == r[None, :], 1.0, 0.0)
    block = r // B
    diagonal = tl.where(block[:, None] == block[None, :], A, 0.0)
    zeros = tl.zeros((C, C), dtype=tl.float32)
    m = eye
    for i in range(1, B):
        rows = (r % B) == i
        step = _dot(tl.where(rows[:, None], diagonal, 0.0), m, zeros, ROW_STABLE, TF32)
        m = tl.where(rows[:, None], eye - step, m)
    x = m
    for b in range(1, 4):
        rows = block[:, None] == b
        below = _dot(tl.where(rows & (block[None, :] < b), A, 0.0), x, zeros, ROW_STABLE, TF32)
        x = x - _dot(tl.where(rows, m, 0.0), below, zeros, ROW_STABLE, TF32)
    return x


@triton.jit
def _chunk_kernel(
    q_ptr,  # [chunks * C, HV, DK] float32: the span's rows
    k_ptr,  # [chunks * C, HV, DK]
    v_ptr,  # [chunks * C, HV, DV]
    beta_ptr,  # [chunks * C, HV]
    g_ptr,  # [chunks * C, HV]
    w_ptr,  # [chunks, HV, C, DK] out: W
    u_ptr,  # [chunks, HV, C, DV] out: U
    qg_ptr,  # [chunks, HV, C, DK] out: gamma * Q
    kg_ptr,  # [chunks, HV, C, DK] out: exp(G_last - G) * K
    p_ptr,  # [chunks, HV, C, C] out: P
    last_ptr,  # [chunks, HV] out: gamma_last
    HV: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    C: tl.constexpr,
    ROW_STABLE: tl.constexpr,
    TF32: tl.constexpr,
):
    """One (chunk, value head): the chunk's matrices, which do not depend on S."""
    c = tl.program_id(0)
    h = tl.program_id(1)
    r = tl.arange(0, C)
    dk = tl.arange(0, DK)
    dv = tl.arange(0, DV)
    row = (c * C + r) * HV + h  # [C]
    k = tl.load(k_ptr + row[:, None] * DK + dk[None, :])
    q = tl.load(q_ptr + row[:, None] * DK + dk[None, :])
    v = tl.load(v_ptr + row[:, None] * DV + dv[None, :])
    beta = tl.load(beta_ptr + row)
    G = tl.cumsum(tl.load(g_ptr + row), axis=0)
    strict = r[:, None] > r[None, :]
    incl = r[:, None] >= r[None, :]
    decay = tl.where(incl, tl.exp(tl.where(incl, G[:, None] - G[None, :], 0.0)), 0.0)
    kk = _dot(k, tl.trans(k), tl.zeros((C, C), dtype=tl.float32), ROW_STABLE, TF32)
    A = tl.where(strict, beta[:, None] * decay * kk, 0.0)
    inv = _unit_lower_inverse(A, r, C, ROW_STABLE, TF32)
    gamma = tl.exp(G)
    zeros_k = tl.zeros((C, DK), dtype=tl.float32)
    W = _dot(inv, k * (beta * gamma)[:, None], zeros_k, ROW_STABLE, TF32)
    U = _dot(inv, v * beta[:, None], tl.zeros((C, DV), dtype=tl.float32), ROW_STABLE, TF32)
    P = decay * _dot(q, tl.trans(k), tl.zeros((C, C), dtype=tl.float32), ROW_STABLE, TF32)
    G_last = tl.sum(tl.where(r == C - 1, G, 0.0), axis=0)
    out = (c * HV + h) * C + r  # [C]: the chunk's rows in the outputs
    tl.store(w_ptr + out[:, None] * DK + dk[None, :], W)
    tl.store(u_ptr + out[:, None] * DV + dv[None, :], U)
    tl.store(qg_ptr + out[:, None] * DK + dk[None, :], q * gamma[:, None])
    tl.store(kg_ptr + out[:, None] * DK + dk[None, :], k * tl.exp(G_last - G)[:, None])
    tl.store(p_ptr + out[:, None] * C + r[None, :], P)
    tl.store(last_ptr + c * HV + h, tl.exp(G_last))


@triton.jit
def _scan_kernel(
    w_ptr,  # [chunks, HV, C, DK] float32
    u_ptr,  # [chunks, HV, C, DV]
    kg_ptr,  # [chunks, HV, C, DK]
    last_ptr,  # [chunks, HV]
    state_ptr,  # [HV, DK, DV] float32: S before the first chunk
    starts_ptr,  # [chunks, HV, DK, DV] float32 out: S before each chunk
    d_ptr,  # [chunks, HV, C, DV] float32 out: each chunk's deltas D
    state_out_ptr,  # [HV, DK, DV] float32 out: S after the first num_whole chunks
    num_chunks,
    num_whole,  # chunks whose end state is carried on (a last partial one is not)
    HV: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    C: tl.constexpr,
    BLOCK_V: tl.constexpr,
    ROW_STABLE: tl.constexpr,
    TF32: tl.constexpr,
):
    """One (value head, block of value columns): the chunks in order, S in registers, two
    products a chunk (the outputs are _output_kernel's, parallel over chunks)."""
    h = tl.program_id(0)
    r = tl.arange(0, C)
    dk = tl.arange(0, DK)
    dv = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    s_offs = h * DK * DV + dk[:, None] * DV + dv[None, :]
    S = tl.load(state_ptr + s_offs)
    zeros = tl.zeros((C, BLOCK_V), dtype=tl.float32)
    for c in range(0, num_chunks):
        tl.store(starts_ptr + c * HV * DK * DV + s_offs, S)
        row = (c * HV + h) * C + r
        W = tl.load(w_ptr + row[:, None] * DK + dk[None, :])
        D = tl.load(u_ptr + row[:, None] * DV + dv[None, :]) - _dot(W, S, zeros, ROW_STABLE, TF32)
        tl.store(d_ptr + row[:, None] * DV + dv[None, :], D)
        kg = tl.load(kg_ptr + row[:, None] * DK + dk[None, :])
        after = tl.load(last_ptr + c * HV + h) * S + _dot(
            tl.trans(kg), D, tl.zeros((DK, BLOCK_V), dtype=tl.float32), ROW_STABLE, TF32
        )
        S = tl.where(c < num_whole, after, S)
    tl.store(state_out_ptr + s_offs, S)


@triton.jit
def _output_kernel(
    qg_ptr,  # [chunks, HV, C, DK] float32
    p_ptr,  # [chunks, HV, C, C]
    starts_ptr,  # [chunks, HV, DK, DV]
    d_ptr,  # [chunks, HV, C, DV]
    o_ptr,  # [chunks * C, HV, DV] float32 out: S^T q of every row
    HV: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    C: tl.constexpr,
    BLOCK_V: tl.constexpr,
    ROW_STABLE: tl.constexpr,
    TF32: tl.constexpr,
):
    """One (chunk, value head, block of value columns): O = (gamma * Q) S + P D."""
    c = tl.program_id(0)
    h = tl.program_id(1)
    r = tl.arange(0, C)
    dk = tl.arange(0, DK)
    dv = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    row = (c * HV + h) * C + r
    S = tl.load(starts_ptr + (c * HV + h) * DK * DV + dk[:, None] * DV + dv[None, :])
    qg = tl.load(qg_ptr + row[:, None] * DK + dk[None, :])
    P = tl.load(p_ptr + row[:, None] * C + r[None, :])
    D = tl.load(d_ptr + row[:, None] * DV + dv[None, :])
    zeros = tl.zeros((C, BLOCK_V), dtype=tl.float32)
    o = _dot(P, D, _dot(qg, S, zeros, ROW_STABLE, TF32), ROW_STABLE, TF32)
    tl.store(o_ptr + ((c * C + r) * HV + h)[:, None] * DV + dv[None, :], o)


def chunks_forward(q, k, v, beta, g, state, num_whole: int):
    """The chunk and scan kernels over a span of whole chunks (span_rows' tensors) from the
    state before it: (S^T q of every row [rows, value_heads, dv], S after the first num_whole
    chunks), float32."""
    rows, hv, dk = k.shape
    dv, dev, f32 = v.shape[2], k.device, torch.float32
    check(rows % CHUNK == 0, f"a span of whole {CHUNK}-row chunks, not {rows} rows")
    num_chunks = rows // CHUNK
    mats = [
        torch.empty((num_chunks, hv, CHUNK, d), dtype=f32, device=dev) for d in (dk, dv, dk, dk)
    ]
    p = torch.empty((num_chunks, hv, CHUNK, CHUNK), dtype=f32, device=dev)
    last = torch.empty((num_chunks, hv), dtype=f32, device=dev)
    stable = interpreting()
    # one stage: the scan loads five tiles a chunk, which pipelined (3 stages) passed the 227 KB
    # of shared memory on an H100
    launch = {} if stable else {"num_warps": _WARPS, "num_stages": 1}
    _chunk_kernel[(num_chunks, hv)](
        *(x.contiguous() for x in (q, k, v, beta, g)), *mats, p, last,
        HV=hv, DK=dk, DV=dv, C=CHUNK, ROW_STABLE=stable, TF32=TF32, **launch, **unfused_launch(),
    )  # fmt: skip
    w, u, qg, kg = mats
    starts = torch.empty((num_chunks, hv, dk, dv), dtype=f32, device=dev)
    d = torch.empty((num_chunks, hv, CHUNK, dv), dtype=f32, device=dev)
    state_after = torch.empty_like(state)
    block_v = min(dv, _BLOCK_V)
    consts = dict(HV=hv, DK=dk, DV=dv, C=CHUNK, BLOCK_V=block_v, ROW_STABLE=stable, TF32=TF32)
    _scan_kernel[(hv, dv // block_v)](
        w, u, kg, last, state.contiguous(), starts, d, state_after, num_chunks, num_whole,
        **consts, **launch, **unfused_launch(),
    )  # fmt: skip
    o = torch.empty((rows, hv, dv), dtype=f32, device=dev)
    _output_kernel[(num_chunks, hv, dv // block_v)](
        qg, p, starts, d, o, **consts, **launch, **unfused_launch()
    )
    return o, state_after


def chunked_gated_delta(mixed, z, b, a, carry: ChunkCarry, w: DeltaRuleWeights):
    """As ref_chunked_gated_delta (same arguments and results), through the kernels."""
    hk, hv, dk, dv = w.key_heads, w.value_heads, w.key_dim, w.value_dim
    t, conv_dim = mixed.shape
    kernel = w.taps.shape[1]
    check(conv_dim == 2 * hk * dk + hv * dv and hv % hk == 0, "DeltaNet head layout")
    check(
        dk == triton.next_power_of_2(dk) and dv == triton.next_power_of_2(dv) and min(dk, dv) >= 16,
        f"head dims must be powers of two from 16, got {dk}, {dv}",
    )
    check(carry.state.shape == (hv, dk, dv) and carry.state.dtype == torch.float32, "state")
    check(carry.conv.shape == (conv_dim, kernel - 1), "conv window")
    for x, name in ((mixed, "mixed"), (z, "z"), (b, "b"), (a, "a")):
        check(x is None or x.stride(-1) == 1, f"{name} needs unit stride along its last dim")
    if not t:
        return (None if z is None else mixed.new_empty((0, hv, dv), dtype=w.norm.dtype)), carry
    dev, f32 = mixed.device, torch.float32
    new = [torch.empty((t, hv, d), dtype=f32, device=dev) for d in (dk, dk, dv)]
    new += [torch.empty((t, hv), dtype=f32, device=dev) for _ in range(2)]
    _features_kernel[(triton.cdiv(t, _BLOCK_T), hv)](
        mixed, b, a, carry.conv.contiguous(), w.taps.contiguous(), w.neg_a, w.dt_bias, *new, t,
        mixed.stride(0), b.stride(0), a.stride(0), dk**-0.5, L2_EPS,
        HK=hk, HV=hv, DK=dk, DV=dv, KERNEL=kernel, BLOCK_T=_BLOCK_T, **unfused_launch(),
    )  # fmt: skip
    span = span_rows(carry, *new)
    n = carry.num_partial
    o, state = chunks_forward(*span, carry.state, (n + t) // CHUNK)
    out = None
    if z is not None:
        out = torch.empty((t, hv, dv), dtype=w.norm.dtype, device=dev)
        _gated_norm_kernel[(t * hv,)](
            o[n : n + t], z, w.norm, out, z.stride(0), w.eps, HV=hv, DV=dv, **unfused_launch()
        )
    return out, _carry_after(carry, mixed, span, state)


def slot_shape(value_heads: int, dk: int, dv: int) -> tuple[int, int, int]:
    """A carry's tensors (but the conv window) in one state-pool slot per layer, per value
    head: S, then the current chunk's k, v, beta and g rows (cache/state_pool.py stores it as
    it stores the recurrent form's S)."""
    return (value_heads, 1, dk * dv + CHUNK * (dk + dv + 2))


def carry_from_slot(conv: torch.Tensor, slot: torch.Tensor, position: int, dk: int, dv: int):
    """The carry a slot [value_heads, 1, ...] (slot_shape) holds after `position` rows."""
    hv = slot.shape[0]
    s, k, v, beta, g = slot.reshape(hv, -1).split(
        [dk * dv, CHUNK * dk, CHUNK * dv, CHUNK, CHUNK], 1
    )
    rows = lambda x, *d: x.reshape(hv, CHUNK, *d).transpose(0, 1)  # noqa: E731
    return ChunkCarry(conv, s.reshape(hv, dk, dv), rows(k, dk), rows(v, dv), beta.T, g.T, position)


def slot_from_carry(carry: ChunkCarry) -> torch.Tensor:
    """carry_from_slot's inverse: the slot's tensor [value_heads, 1, ...]."""
    hv = carry.state.shape[0]
    parts = [carry.state, carry.k.transpose(0, 1), carry.v.transpose(0, 1), carry.beta.T, carry.g.T]
    return torch.cat([x.reshape(hv, -1) for x in parts], dim=1)[:, None, :]
