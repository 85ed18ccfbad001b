"""Batch-invariant linear over affine codes (MLX 2/4/8-bit): out[M, N] = x[M, K] @ w[N, K].T
with w = scale * code + bias per group, dequantized in registers.

The codes are never laid out as a [N, K] tile. Each program loads a tile of whole words,
[BLOCK_N, WORDS], and takes the j-th code of every word as one [BLOCK_N, WORDS] slice of the
weight: the columns k0 + j, k0 + PER_WORD + j, k0 + 2 * PER_WORD + j, ... So a step of
STEP = WORDS * PER_WORD columns is PER_WORD tensor-core products of K = WORDS, each against the
activation's matching strided columns, added into one fp32 accumulator in ascending j:

    words  w0 = [c0 c1 .. c7]  w1 = [c8 .. c15]  ...            (4-bit: PER_WORD = 8)
    j = 0: columns 0, 8, 16, ...   j = 1: columns 1, 9, 17, ...   ...   j = 7: 7, 15, 23, ...

Every code is a shift and a mask of a word already in the thread's registers: no reshape of a
[BLOCK_N, WORDS, PER_WORD] tensor into [BLOCK_N, K] and no broadcast of the scales over their
group, which cost the old tile ~18 instructions per weight and a trip through shared memory on
the H200. A word's codes share one group (PER_WORD divides the group), so its scale and bias
are loaded per word.

The reduction's shape is the float matmul's: steps in ascending order inside SPLIT segments
(from the weight's shape only, never from M), the segments added in ascending order, by the
tile's last-arriving program at decode (split-K) or in one program at larger M. It is its own
order, not the float matmul's (columns are visited by j within a step), so a packed weight and
its dequantized float copy agree to rounding, not bitwise; every row of a packed weight has the
same bits at any M.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from lanes.kernels.common import fp32_dot, interpreting, pdl_launch, tickets, wait_for_inputs
from lanes.kernels.split_plan import SMALL_M, Plan, plan_for, store_tile, target_programs
from lanes.packed import PackedWeight

WORDS = 16  # words per row in a step: the tensor cores' K per product (16 for bf16/fp16)


def step_for(bits: int) -> int:
    """Columns per step: WORDS words of 32 // bits codes (128 at 4 bits)."""
    return WORDS * 32 // bits


@functools.cache
def packed_plan(n: int, k: int, bits: int, target: int) -> Plan:
    """The float matmul's plan rule over this weight's steps (a last step past K is masked)."""
    step = step_for(bits)
    return plan_for(n, triton.cdiv(k, step) * step, target, step=step)


@triton.jit
def _packed_matmul_kernel(
    x_ptr,  # [M, K]
    w_ptr,  # int32 codes [N, K * BITS / 32]
    scale_ptr,  # [N, K / GROUP]
    shift_ptr,  # [N, K / GROUP] biases: w = scale * code + bias
    bias_ptr,  # [N] or dummy
    out_ptr,  # [M, N]
    part_ptr,  # [SPLIT, M, N] fp32 partials (PARTIAL) or dummy
    ticket_ptr,  # [tiles] int32 arrival counters (PARTIAL) or dummy
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_sn,
    SEG_K,  # columns per segment, a runtime value (see matmul._matmul_kernel)
    SPLIT: tl.constexpr,
    PARTIAL: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    UPCAST: tl.constexpr,  # fp32 products (fp32 models and the CPU interpreter)
    ROW_STABLE: tl.constexpr,  # the interpreter: see common.fp32_dot
    BITS: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    WORDS: tl.constexpr,
    WEIGHT_LEFT: tl.constexpr,  # the weight as the product's left operand (out.T = w @ x.T)
    PDL: tl.constexpr,
):
    PER_WORD: tl.constexpr = 32 // BITS
    STEP: tl.constexpr = WORDS * PER_WORD
    CODE: tl.constexpr = (1 << BITS) - 1
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rw = tl.arange(0, WORDS)
    mask_m = rm < M
    mask_n = rn < N
    if PARTIAL:
        first = tl.program_id(2)
        last = first + 1
    else:
        first = 0
        last = SPLIT
    wait_for_inputs(PDL)
    if WEIGHT_LEFT:
        total = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for s in range(first, last):
        acc = tl.zeros_like(total)
        for kb in range(0, SEG_K, STEP):
            col = s * SEG_K + kb + rw * PER_WORD  # [WORDS]: each word's first column
            mask_k = col < K
            mask_w = mask_n[:, None] & mask_k[None, :]
            word = tl.load(
                w_ptr + rn[:, None] * stride_wn + (col // PER_WORD)[None, :], mask=mask_w, other=0
            )
            at = rn[:, None] * stride_sn + (col // GROUP)[None, :]
            scale = tl.load(scale_ptr + at, mask=mask_w, other=0.0).to(tl.float32)
            shift = tl.load(shift_ptr + at, mask=mask_w, other=0.0).to(tl.float32)
            x_at = x_ptr + rm[:, None] * stride_xm + col[None, :]
            mask_x = mask_m[:, None] & mask_k[None, :]
            for j in tl.static_range(PER_WORD):
                code = (word >> (j * BITS)) & CODE
                # scale * code + bias in fp32 (one fma: left to ptxas, a multiply and an add
                # may or may not be fused, per compiled variant), then the dtype
                w = tl.fma(code.to(tl.float32), scale, shift).to(x_ptr.dtype.element_ty)
                a = tl.load(x_at + j, mask=mask_x, other=0.0)
                if UPCAST:  # a true fp32 product, no TF32
                    if WEIGHT_LEFT:
                        acc = fp32_dot(
                            w.to(tl.float32), tl.trans(a.to(tl.float32)), acc, ROW_STABLE
                        )
                    else:
                        acc = fp32_dot(
                            a.to(tl.float32), tl.trans(w.to(tl.float32)), acc, ROW_STABLE
                        )
                elif WEIGHT_LEFT:
                    acc = tl.dot(w, tl.trans(a), acc)
                else:
                    acc = tl.dot(a, tl.trans(w), acc)
        total += acc
    if WEIGHT_LEFT:
        total = tl.trans(total)
    mask = mask_m[:, None] & mask_n[None, :]
    out_offs = rm[:, None] * N + rn[None, :]
    if PARTIAL:  # as matmul._matmul_kernel: the tile's last arrival adds the segments in order
        tl.store(part_ptr + first * M * N + out_offs, total, mask=mask)
        tl.debug_barrier()
        tile = pid_m * tl.num_programs(1) + pid_n
        arrived = tl.atomic_add(ticket_ptr + tile, 1, sem="acq_rel")
        if arrived == SPLIT - 1:
            total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for s in range(SPLIT):
                total += tl.load(
                    part_ptr + s * M * N + out_offs, mask=mask, other=0.0, cache_modifier=".cg"
                )
            tl.atomic_xchg(ticket_ptr + tile, 0)
            store_tile(total, bias_ptr, out_ptr, out_offs, rn, mask, mask_n, HAS_BIAS)
    else:
        store_tile(total, bias_ptr, out_ptr, out_offs, rn, mask, mask_n, HAS_BIAS)


@dataclass(frozen=True)
class PackedTiles:
    """How _packed_matmul_kernel is launched for some M: tile sizes never change a row's bits
    (the products' order is fixed by WORDS and the plan)."""

    block_m: int
    block_n: int | None = None  # None: the plan's
    num_warps: int = 4
    weight_left: bool = False


DECODE_TILES = PackedTiles(block_m=16)
FEW_ROWS_TILES = PackedTiles(block_m=64)  # 17 - SMALL_M rows: each weight tile read once
PREFILL_TILES = PackedTiles(block_m=128, block_n=128, num_warps=8)


def tiles_for(m: int, dtype: torch.dtype) -> PackedTiles:
    """fp32 products are FMA loops whose order follows the tile: one tile shape for fp32."""
    if m <= 16 or dtype == torch.float32 or interpreting():
        return DECODE_TILES
    return FEW_ROWS_TILES if m <= SMALL_M else PREFILL_TILES


def packed_matmul(
    x: torch.Tensor, w: PackedWeight, bias: torch.Tensor | None, tiles: PackedTiles | None = None
) -> torch.Tensor:
    """x [M, K] @ w.T (+ bias) -> [M, N] in x's dtype; batch-invariant. Called by matmul.matmul
    after its checks; `tiles` overrides tiles_for (bench sweeps)."""
    m = x.shape[0]
    n, k = w.shape
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    plan = packed_plan(n, k, w.bits, target_programs(x.device))
    partial = plan.split > 1 and m <= SMALL_M
    tiles = tiles or tiles_for(m, x.dtype)
    block_n = tiles.block_n or plan.block_n
    grid_mn = (triton.cdiv(m, tiles.block_m), triton.cdiv(n, block_n))
    counters = tickets(x.device, grid_mn[0] * grid_mn[1] if partial else 0, "matmul")
    if partial:
        parts = torch.empty((plan.split, m, n), dtype=torch.float32, device=x.device)
        grid = (*grid_mn, plan.split)
    else:
        parts = out
        grid = grid_mn
    step = step_for(w.bits)
    _packed_matmul_kernel[grid](
        x,
        w.codes.view(torch.int32),
        w.scales,
        w.biases,
        bias if bias is not None else out,
        out,
        parts,
        counters,
        m,
        n,
        k,
        x.stride(0),
        w.codes.stride(0),
        w.scales.stride(0),
        SEG_K=triton.cdiv(k, step) * step // plan.split,
        SPLIT=plan.split,
        PARTIAL=partial,
        HAS_BIAS=bias is not None,
        UPCAST=interpreting() or x.dtype == torch.float32,
        ROW_STABLE=interpreting(),
        BITS=w.bits,
        GROUP=w.group,
        BLOCK_M=tiles.block_m,
        BLOCK_N=block_n,
        WORDS=WORDS,
        WEIGHT_LEFT=tiles.weight_left,
        num_warps=tiles.num_warps,
        **pdl_launch(x.device),
    )
    return out
