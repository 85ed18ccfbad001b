"""Batch-invariant linear over affine codes (MLX 2/4/8-bit): out[M, N] = x[M, K] @ w[N, K].T
with w = scale * code + bias per group, dequantized in registers tile by tile.

The reduction has the float matmul's shape (kernels/matmul.py): BLOCK_K-wide steps in
ascending order inside SPLIT segments (from the weight's shape only, never from M), the
segments added in ascending order by the tile's last-arriving program at decode (split-K) or in
one program at larger M. A row has the same bits at any M as long as the tiles stay on the
warp-level MMA (PackedTiles). A packed weight and its dequantized float copy agree to rounding,
not bitwise.

A program reads its tile's codes as bytes, [BLOCK_N, BLOCK_K * BITS / 8], takes a byte's codes
apart in registers and interleaves them into columns, with one scale and bias per row (a step
never spans two groups). 4-bit codes in bf16/fp16 on a GPU become weights two at a time by
packed half-precision arithmetic (_paired_nibbles); elsewhere scale * code + bias is one fp32
fma. Compiled for sm_90 (Triton 3.9), the packed-pairs tile issues ~5.7 instructions a
weight, the old reshaped tile 19.6 (bench/NOTES.md, sixteenth session).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from lanes.kernels.common import fp32_dot, interpreting, pdl_launch, wait_for_inputs
from lanes.kernels.split_plan import (
    BLOCK_K,
    SMALL_M,
    finish_tile,
    plan_for,
    segments,
    split_buffers,
    target_programs,
)
from lanes.kernels.triton_shim import tl, triton
from lanes.packed import PackedWeight


@triton.jit
def _packed_matmul_kernel(
    x_ptr,  # [M, K]
    w_ptr,  # the codes' bytes [N, K * BITS / 8]
    scale_ptr,  # [N, K / GROUP]
    shift_ptr,  # [N, K / GROUP] biases: w = scale * code + bias
    bias_ptr,  # [N] or dummy
    out_ptr,  # [M, N]
    part_ptr,  # [SPLIT, M, N] fp32 partials (PARTIAL) or dummy
    ticket_ptr,  # [tiles] int32 arrival counters (PARTIAL) or dummy
    M,
    N,
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
    BLOCK_K: tl.constexpr,  # <= GROUP
    PAIRED: tl.constexpr,  # 4-bit codes to bf16/fp16 by packed arithmetic (_paired_nibbles)
    WEIGHT_LEFT: tl.constexpr,  # the weight as the product's left operand (out.T = w @ x.T)
    PDL: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    mask_m = rm < M
    mask_n = rn < N
    first, last = segments(PARTIAL, SPLIT)
    wait_for_inputs(PDL)
    if WEIGHT_LEFT:
        total = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for s in range(first, last):
        acc = tl.zeros_like(total)
        for kb in range(0, SEG_K, BLOCK_K):
            k0 = s * SEG_K + kb
            a = tl.load(
                x_ptr + rm[:, None] * stride_xm + (k0 + rk)[None, :],
                mask=mask_m[:, None],
                other=0.0,
            )
            w = _dequantized_tile(
                w_ptr, scale_ptr, shift_ptr, rn, mask_n, k0, stride_wn, stride_sn, BITS, GROUP,
                BLOCK_N, BLOCK_K, PAIRED, x_ptr.dtype.element_ty,
            )  # fmt: skip
            if UPCAST:  # a true fp32 product, no TF32
                if WEIGHT_LEFT:
                    acc = fp32_dot(w.to(tl.float32), tl.trans(a.to(tl.float32)), acc, ROW_STABLE)
                else:
                    acc = fp32_dot(a.to(tl.float32), tl.trans(w.to(tl.float32)), acc, ROW_STABLE)
            elif WEIGHT_LEFT:
                acc = tl.dot(w, tl.trans(a), acc)
            else:
                acc = tl.dot(a, tl.trans(w), acc)
        total += acc
    if WEIGHT_LEFT:
        total = tl.trans(total)
    finish_tile(
        total, part_ptr, ticket_ptr, bias_ptr, out_ptr, first, M, N, rm, rn, mask_m, mask_n,
        SPLIT, PARTIAL, HAS_BIAS,
    )  # fmt: skip


@triton.jit
def _dequantized_tile(
    w_ptr, scale_ptr, shift_ptr, rn, mask_n, k0, stride_wn, stride_sn, BITS: tl.constexpr,
    GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PAIRED: tl.constexpr,
    DTYPE: tl.constexpr,
):  # fmt: skip
    """The weight tile [BLOCK_N, BLOCK_K] at columns k0.. in DTYPE (BLOCK_K <= GROUP: one scale
    and bias per row). w_ptr walks the codes as bytes (a row's stride in bytes; little-endian
    words hold their codes least significant first, so a byte's low bits are the lower column);
    a byte's codes are interleaved in registers."""
    at_k = k0 * BITS // 8 + tl.arange(0, BLOCK_K * BITS // 8)
    raw = tl.load(w_ptr + rn[:, None] * stride_wn + at_k[None, :], mask=mask_n[:, None], other=0)
    at = rn * stride_sn + k0 // GROUP
    scale = tl.load(scale_ptr + at, mask=mask_n, other=0.0)[:, None]
    shift = tl.load(shift_ptr + at, mask=mask_n, other=0.0)[:, None]
    if PAIRED:
        low, high = _paired_nibbles(raw, scale, shift)
        return tl.interleave(low, high)
    if BITS == 8:
        code = raw.to(tl.float32)
    elif BITS == 4:
        code = tl.interleave((raw & 15).to(tl.float32), (raw >> 4).to(tl.float32))
    else:  # four 2-bit codes a byte
        even = tl.interleave((raw & 3).to(tl.float32), ((raw >> 4) & 3).to(tl.float32))
        odd = tl.interleave(((raw >> 2) & 3).to(tl.float32), (raw >> 6).to(tl.float32))
        code = tl.interleave(even, odd)
    # scale * code + bias in fp32 as one fma (a multiply and an add left to ptxas may or may
    # not be fused, per compiled variant), then the dtype
    return tl.fma(code, scale.to(tl.float32), shift.to(tl.float32)).to(DTYPE)


def _paired_asm(magic: str, neg: str, one: str, fma: str) -> tl.constexpr:
    """PTX for _paired_nibbles: $4 holds four code bytes, $5-$6 their rows' scales and $7-$8
    their biases (two to a register); $0-$1 get the low nibbles' weights, $2-$3 the high ones'.
    prmt 0x5140 puts bytes 0 and 1 under the magic exponent, 0x7362 bytes 2 and 3."""
    pairs = []
    for out, (nibbles, sel, scale, bias) in enumerate(
        [
            ("lo", "0x5140", 5, 7),
            ("lo", "0x7362", 6, 8),
            ("hi", "0x5140", 5, 7),
            ("hi", "0x7362", 6, 8),
        ]
    ):
        pairs.append(
            f"prmt.b32 v, {nibbles}, magic, {sel}; {fma} v, v, one, neg; "
            f"{fma} ${out}, v, ${scale}, ${bias};"
        )
    return tl.constexpr(
        "{ .reg .b32 lo, hi, v, magic, one, neg; "
        f"mov.b32 magic, {magic}; mov.b32 one, {one}; mov.b32 neg, {neg}; "
        "and.b32 lo, $4, 0x0F0F0F0F; shr.u32 hi, $4, 4; and.b32 hi, hi, 0x0F0F0F0F; "
        + " ".join(pairs)
        + " }"
    )


# the magic number 128.0 (bf16) / 1024.0 (fp16) in each half, its negation and 1.0
_PAIRED_BF16 = _paired_asm("0x43434343", "0xC300C300", "0x3F803F80", "fma.rn.bf16x2")
_PAIRED_FP16 = _paired_asm("0x64646464", "0xE400E400", "0x3C003C00", "fma.rn.f16x2")
_PAIRED_CONSTRAINTS = tl.constexpr("=r,=r,=r,=r,r,r,r,r,r")  # 4 outputs, then $4-$8


@triton.jit
def _paired_nibbles(raw, scale, shift):
    """4-bit codes to bf16/fp16 two at a time (sm_80+ packed half-precision arithmetic): a
    nibble OR'd into the mantissa of 128.0 (bf16 0x4300; fp16: 1024.0, 0x6400) is 128 + code
    exactly; subtracting the magic number leaves the code, and one packed fma gives
    scale * code + bias rounded once to the dtype. ~2 instructions a weight where the fp32 route
    (convert, fma, narrow) takes ~4. Returns the low and the high nibbles' weights."""
    scale = tl.broadcast_to(scale, raw.shape)
    shift = tl.broadcast_to(shift, raw.shape)
    dtype = scale.dtype  # the weights': bf16 or fp16
    if dtype == tl.bfloat16:
        return tl.inline_asm_elementwise(
            _PAIRED_BF16, _PAIRED_CONSTRAINTS, [raw, scale, shift], (dtype, dtype), True, 4
        )
    return tl.inline_asm_elementwise(
        _PAIRED_FP16, _PAIRED_CONSTRAINTS, [raw, scale, shift], (dtype, dtype), True, 4
    )


def paired(bits: int, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether 4-bit codes take the packed half-precision route (_paired_nibbles): bf16/fp16
    on a GPU of compute capability 8.0 or later. Its weights are rounded once, to the dtype,
    where the fp32 route rounds to fp32 and then to the dtype; either way one route per device
    and dtype, so a row's bits never depend on M."""
    return bits == 4 and dtype in (torch.bfloat16, torch.float16) and _half_pairs(device)


@functools.cache
def _half_pairs(device: torch.device) -> bool:
    return (
        device.type == "cuda"
        and not interpreting()
        and torch.cuda.get_device_capability(device)[0] >= 8
    )


@dataclass(frozen=True)
class PackedTiles:
    """How _packed_matmul_kernel is launched for some M. Its tensor-core products must stay on
    the warp-level MMA (mma.sync): tiles whose MMA is 64 rows or more with 4+ warps run
    Hopper's warpgroup MMA, and there a packed row came out in other bits than at M = 1 (H200,
    results/session16-h200/call3: every 8B weight, with either dequantization route; the float
    kernel's rows agree across both). Under that rule tile sizes never change a row's bits."""

    block_m: int
    block_n: int | None = None  # None: the plan's
    num_warps: int = 4
    weight_left: bool = False  # the weight as the left operand: its columns are the MMA's rows


# H200, 8B weights at 4 bits (session16-h200 calls 2-3): decode 16 rows and the plan's columns
# (qkv 15.3 us, gate_up 47.3, down 30.4, lm_head 174); 17-64 rows in 32-row tiles (qkv +
# gate_up at M = 37: 263 us; 64 rows in 2 warps 291); prefill 32 weight columns a program against
# 128 rows, weight on the left, 2 warps (gate_up + down at M = 2,048: 3.8 ms, bf16 1.25)
DECODE_TILES = PackedTiles(block_m=16)
FEW_ROWS_TILES = PackedTiles(block_m=32)
PREFILL_TILES = PackedTiles(block_m=128, block_n=32, num_warps=2, weight_left=True)


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
    # no 128-wide decode steps (a packed tile's registers hold its codes as well)
    plan = plan_for(n, k, target_programs(x.device))
    partial = plan.split > 1 and m <= SMALL_M
    tiles = tiles or tiles_for(m, x.dtype)
    block_n = tiles.block_n or plan.block_n
    grid_mn = (triton.cdiv(m, tiles.block_m), triton.cdiv(n, block_n))
    parts, grid, counters = split_buffers(out, plan.split, partial, grid_mn)
    _packed_matmul_kernel[grid](
        x,
        w.codes.view(torch.uint8),
        w.scales,
        w.biases,
        bias if bias is not None else out,
        out,
        parts,
        counters,
        m,
        n,
        x.stride(0),
        w.codes.stride(0) * 4,  # in bytes
        w.scales.stride(0),
        SEG_K=k // plan.split,
        SPLIT=plan.split,
        PARTIAL=partial,
        HAS_BIAS=bias is not None,
        UPCAST=interpreting() or x.dtype == torch.float32,
        ROW_STABLE=interpreting(),
        BITS=w.bits,
        GROUP=w.group,
        BLOCK_M=tiles.block_m,
        BLOCK_N=block_n,
        BLOCK_K=min(BLOCK_K, w.group),  # a step within one group
        PAIRED=paired(w.bits, x.dtype, x.device),
        WEIGHT_LEFT=tiles.weight_left,
        num_warps=tiles.num_warps,
        **pdl_launch(x.device),
    )
    return out
