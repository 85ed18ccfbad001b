"""Batch-invariant linear: out[M, N] = x[M, K] @ w[N, K].T (+ bias), fp32 accumulation.

A row's result must not depend on M. So the reduction over K has one shape per weight: blocks of
BLOCK_K in ascending order, grouped into SPLIT segments (SPLIT chosen from N and K only, never
from M), each segment summed on its own, the segments then added in ascending order:

    out = ((seg_0 + seg_1) + seg_2) + ...      seg_s = sum of its BLOCK_K blocks, in order

Small M runs the segments in parallel programs (fp32 partials, then a fixed-order reduce kernel):
decode needs the parallelism. Large M runs all segments in one program per tile with one
accumulator each: the same sums, no workspace. Both give the same bits.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lanes.kernels.common import interpreting

BLOCK_N = 64
BLOCK_K = 64
_SMALL_M = 64  # up to this many rows: parallel segments
_TARGET_PROGRAMS = 264  # about two per SM on an H200 (132 SMs)


def split_for(n: int, k: int) -> int:
    """Segments of the K reduction for a weight of shape [n, k]: a pure function of the shape."""
    tiles = triton.cdiv(n, BLOCK_N)
    split = 1
    while tiles * split < _TARGET_PROGRAMS and split < 8 and k % (2 * split * BLOCK_K) == 0:
        split *= 2
    return split


@triton.jit
def _matmul_kernel(
    x_ptr,  # [M, K]
    w_ptr,  # [N, K]
    bias_ptr,  # [N] or dummy
    out_ptr,  # [M, N] (final) or [SPLIT, M, N] fp32 partials
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    SEG_K: tl.constexpr,  # K / SPLIT
    SPLIT: tl.constexpr,
    PARTIAL: tl.constexpr,  # one segment per program, write fp32 partials
    HAS_BIAS: tl.constexpr,
    UPCAST: tl.constexpr,  # compute the dot in fp32 (CPU interpreter)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    mask_m = rm < M
    mask_n = rn < N
    if PARTIAL:
        first = tl.program_id(2)
        last = first + 1
    else:
        first = 0
        last = SPLIT
    total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for s in range(first, last):
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kb in range(0, SEG_K, BLOCK_K):
            k = s * SEG_K + kb + rk
            a = tl.load(
                x_ptr + rm[:, None] * stride_xm + k[None, :], mask=mask_m[:, None], other=0.0
            )
            b = tl.load(
                w_ptr + rn[:, None] * stride_wn + k[None, :], mask=mask_n[:, None], other=0.0
            )
            if UPCAST:  # fp32 models and the CPU interpreter: a true fp32 product, no TF32
                acc = tl.dot(
                    a.to(tl.float32), tl.trans(b.to(tl.float32)), acc, input_precision="ieee"
                )
            else:
                acc = tl.dot(a, tl.trans(b), acc)
        total += acc
    mask = mask_m[:, None] & mask_n[None, :]
    if PARTIAL:
        offs = first * M * N + rm[:, None] * N + rn[None, :]
        tl.store(out_ptr + offs, total, mask=mask)
    else:
        if HAS_BIAS:
            total += tl.load(bias_ptr + rn, mask=mask_n, other=0.0).to(tl.float32)[None, :]
        tl.store(
            out_ptr + rm[:, None] * N + rn[None, :], total.to(out_ptr.dtype.element_ty), mask=mask
        )


@triton.jit
def _reduce_kernel(
    part_ptr,  # [SPLIT, M, N] fp32
    bias_ptr,  # [N] or dummy
    out_ptr,  # [M, N]
    MN,
    N,
    SPLIT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(SPLIT):  # ascending: the same order as the single-program path
        total += tl.load(part_ptr + s * MN + offs, mask=mask, other=0.0)
    if HAS_BIAS:
        total += tl.load(bias_ptr + offs % N, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, total.to(out_ptr.dtype.element_ty), mask=mask)


def matmul(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ w [N, K].T + bias [N] -> [M, N] in x's dtype; batch-invariant."""
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(
            f"matmul needs x [M, K] and w [N, K], got {tuple(x.shape)} and {tuple(w.shape)}"
        )
    if x.dtype != w.dtype or x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"matmul dtypes: x {x.dtype}, w {w.dtype}")
    if x.stride(1) != 1 or w.stride(1) != 1:
        raise ValueError("matmul needs unit stride along K")
    m, k = x.shape
    n = w.shape[0]
    if k % BLOCK_K:
        raise ValueError(f"K ({k}) must be a multiple of {BLOCK_K}")
    if bias is not None and (bias.shape != (n,) or not bias.is_contiguous()):
        raise ValueError(f"bias must be contiguous [{n}]")
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    split = split_for(n, k)
    partial = split > 1 and m <= _SMALL_M
    # bf16/fp16: tensor-core tiles of 16 and 64 rows give a row the same bits (checked on the
    # H200); fp32 products are FMA loops whose order follows the tile, so fp32 keeps one height.
    block_m = 16 if m <= _SMALL_M or x.dtype == torch.float32 else 64
    dummy = bias if bias is not None else out
    grid_mn = (triton.cdiv(m, block_m), triton.cdiv(n, BLOCK_N))
    common = dict(
        SEG_K=k // split,
        SPLIT=split,
        HAS_BIAS=bias is not None,
        UPCAST=interpreting() or x.dtype == torch.float32,
        BLOCK_M=block_m,
        BLOCK_N=BLOCK_N,
        BLOCK_K=BLOCK_K,
    )
    if not partial:
        _matmul_kernel[grid_mn](
            x, w, dummy, out, m, n, k, x.stride(0), w.stride(0), PARTIAL=False, **common
        )
        return out
    parts = torch.empty((split, m, n), dtype=torch.float32, device=x.device)
    _matmul_kernel[(*grid_mn, split)](
        x, w, dummy, parts, m, n, k, x.stride(0), w.stride(0), PARTIAL=True, **common
    )
    block = 1024
    _reduce_kernel[(triton.cdiv(m * n, block),)](
        parts, dummy, out, m * n, n, SPLIT=split, HAS_BIAS=bias is not None, BLOCK=block
    )
    return out


def ref_matmul(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The same math in plain torch (fp32 accumulation)."""
    out = x.float() @ w.float().T
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype)
