"""Batch-invariant linear: out[M, N] = x[M, K] @ w[N, K].T (+ bias), fp32 accumulation.

A row's result must not depend on M. So the reduction over K has one shape per weight: blocks of
BLOCK_K in ascending order, grouped into SPLIT segments (SPLIT chosen from N and K only, never
from M), each segment summed on its own, the segments then added in ascending order:

    out = ((seg_0 + seg_1) + seg_2) + ...      seg_s = sum of its BLOCK_K blocks, in order

Small M runs the segments in parallel programs: each writes its fp32 partial and counts its
arrival on the tile's ticket; the last to arrive (whichever it is) adds the partials in ascending
order and writes the tile, so the reduction costs no second launch and its order never depends on
timing. Large M runs all segments in one program per tile with one accumulator each: the same
sums, no workspace. Both give the same bits. The split comes from the weight's shape
(`plan_for`), never from M; tile sizes only move a row between tensor-core tiles, which leaves its
bits alone (checked on the H200), so prefill runs larger tiles than decode: on Hopper through
tensor descriptors (the TMA engine copies the tiles), in _matmul_tiles_kernel.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from lanes.kernels.triton_shim import tl, triton

try:  # host-side tensor descriptors (Triton >= 3.4)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older Triton: prefill keeps the pointer-load tiles
    TensorDescriptor = None

from lanes.kernels.common import fp32_dot, interpreting, pdl_launch, wait_for_inputs
from lanes.kernels.packed_matmul import packed_matmul
from lanes.kernels.split_plan import (
    BLOCK_K,
    SMALL_M,
    Plan,
    finish_tile,
    plan_for,
    segments,
    split_buffers,
    store_tile,
    target_programs,
    wide_steps,
)
from lanes.packed import PackedWeight

# the plan's names stay reachable here for the benches that sweep plans
__all__ = ["BLOCK_K", "Plan", "matmul", "plan_for", "ref_matmul", "split_for", "target_programs",
           "wide_steps"]  # fmt: skip


def split_for(
    n: int, k: int, device: torch.device, dtype: torch.dtype, packed: bool = False
) -> int:
    """Segments of the K reduction for a weight of shape [n, k] and this dtype on this device
    (`packed`: a PackedWeight, whose decode steps are never 128 wide)."""
    device = torch.device(device)
    wide = not packed and wide_steps(dtype, device)
    return plan_for(n, k, target_programs(device), wide).split


@triton.jit
def _matmul_kernel(
    x_ptr,  # [M, K]
    w_ptr,  # [N, K]
    bias_ptr,  # [N] or dummy
    out_ptr,  # [M, N]
    part_ptr,  # [SPLIT, M, N] fp32 partials (PARTIAL) or dummy
    ticket_ptr,  # [tiles] int32 arrival counters (PARTIAL) or dummy
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    SEG_K,  # K / SPLIT: a runtime value, so a one-block segment is still a loop (a constant
    # one-iteration loop lets Triton fold `total += dot(a, b, 0)` into `dot(a, b, total)`, which
    # rounds differently from the partials' separate sums)
    SPLIT: tl.constexpr,
    PARTIAL: tl.constexpr,  # one segment per program; the tile's last arrival reduces
    HAS_BIAS: tl.constexpr,
    UPCAST: tl.constexpr,  # compute in fp32 (fp32 models and the CPU interpreter)
    ROW_STABLE: tl.constexpr,  # the interpreter: see common.fp32_dot
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
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
            if UPCAST:  # a true fp32 product, no TF32
                acc = fp32_dot(a.to(tl.float32), tl.trans(b.to(tl.float32)), acc, ROW_STABLE)
            else:
                acc = tl.dot(a, tl.trans(b), acc)
        total += acc
    finish_tile(
        total, part_ptr, ticket_ptr, bias_ptr, out_ptr, first, M, N, rm, rn, mask_m, mask_n,
        SPLIT, PARTIAL, HAS_BIAS,
    )  # fmt: skip


@triton.jit
def _matmul_tiles_kernel(
    x_desc,  # [M, K] tensor descriptor: BLOCK_M x BLOCK_K boxes, copied by the TMA engine
    w_desc,  # [N, K] tensor descriptor: BLOCK_N x BLOCK_K boxes
    bias_ptr,
    out_ptr,
    M,
    N,
    SEG_K,  # a runtime value, as in _matmul_kernel
    SPLIT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,  # row tiles per group of the launch order (L2 reuse)
    FLATTEN: tl.constexpr,  # one software pipeline across the segments
):
    """Prefill tiles (M > 64 rows, bf16/fp16, Hopper): _matmul_kernel's one-program path with the
    tiles brought in by tensor descriptors, the same segments summed in the same order, so a row
    keeps its bits. Programs go through the tiles GROUP_M row tiles at a time, so the weight
    columns and activation rows in flight stay in L2."""
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = pid // per_group * GROUP_M
    group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows
    total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for s in tl.range(0, SPLIT, flatten=FLATTEN):
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kb in range(0, SEG_K, BLOCK_K):
            a = x_desc.load([pid_m * BLOCK_M, s * SEG_K + kb])
            b = w_desc.load([pid_n * BLOCK_N, s * SEG_K + kb])
            acc = tl.dot(a, tl.trans(b), acc)
        total += acc
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = rn < N
    mask = (rm < M)[:, None] & mask_n[None, :]
    store_tile(total, bias_ptr, out_ptr, rm[:, None] * N + rn[None, :], rn, mask, mask_n, HAS_BIAS)


@dataclass(frozen=True)
class PrefillTiles:
    """How _matmul_tiles_kernel is launched: a function of the weight's shape, never of M."""

    block_m: int
    block_n: int
    num_warps: int = 8
    num_stages: int = 3
    group_m: int = 8
    flatten: bool = False


# H200, bench_prefill_tiles at M = 8192 (results/prefill-h200/call2): 128 x 256 tiles ran the 8B
# qkv, o and down projections at 590-750 TFLOP/s (pointer loads, 128 x 128: 420-540), 256 x 128
# the 28,672-column gate_up at 742 (128 x 256: 637); cuBLAS 726-813
_WIDE_WEIGHT = PrefillTiles(block_m=256, block_n=128)
_WEIGHT = PrefillTiles(block_m=128, block_n=256)


def prefill_tiles_for(x: torch.Tensor, w: torch.Tensor) -> PrefillTiles | None:
    """The tensor-descriptor tiles for x @ w.T, or None where they do not apply: fp32
    weights, the CPU interpreter, GPUs before Hopper, a Triton without tensor descriptors, or x
    not aligned for the TMA engine."""
    if (
        TensorDescriptor is None
        or x.dtype == torch.float32
        or interpreting()
        or x.device.type != "cuda"
        or torch.cuda.get_device_capability(x.device)[0] < 9
        or x.data_ptr() % 16
        or (x.stride(0) * x.element_size()) % 16
        or w.data_ptr() % 16
    ):
        return None
    return _WIDE_WEIGHT if w.shape[0] >= 16384 else _WEIGHT


def matmul_tiles(x, w, bias, out, split: int, tiles: PrefillTiles) -> None:
    """out = x @ w.T (+ bias) through the tensor-descriptor prefill kernel."""
    m, k = x.shape
    n = w.shape[0]
    grid = (triton.cdiv(m, tiles.block_m) * triton.cdiv(n, tiles.block_n),)
    _matmul_tiles_kernel[grid](
        TensorDescriptor.from_tensor(x, [tiles.block_m, BLOCK_K]),
        TensorDescriptor.from_tensor(w, [tiles.block_n, BLOCK_K]),
        bias if bias is not None else out,
        out,
        m,
        n,
        k // split,
        SPLIT=split,
        HAS_BIAS=bias is not None,
        BLOCK_M=tiles.block_m,
        BLOCK_N=tiles.block_n,
        BLOCK_K=BLOCK_K,
        GROUP_M=tiles.group_m,
        FLATTEN=tiles.flatten,
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )


def matmul(
    x: torch.Tensor, w: torch.Tensor | PackedWeight, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x [M, K] @ w [N, K].T + bias [N] -> [M, N] in x's dtype; batch-invariant. w may be a
    PackedWeight (MLX affine codes, 2/4/8 bits): packed_matmul dequantizes it in registers,
    with the same plan rule and reduction shape."""
    packed = isinstance(w, PackedWeight)
    if x.dim() != 2 or len(w.shape) != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(
            f"matmul needs x [M, K] and w [N, K], got {tuple(x.shape)} and {tuple(w.shape)}"
        )
    if x.dtype != w.dtype or x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"matmul dtypes: x {x.dtype}, w {w.dtype}")
    if x.stride(1) != 1 or (w.codes if packed else w).stride(1) != 1:
        raise ValueError("matmul needs unit stride along K")
    m = x.shape[0]
    n, k = w.shape
    if packed and (
        w.bits not in (2, 4, 8)
        or w.group < 16
        or w.group & (w.group - 1)
        or k % w.group
        or not w.scales.is_contiguous()
    ):
        raise ValueError(
            "packed weights: 2, 4 or 8 bits, groups of a power of two >= 16 and K a multiple of "
            f"the group, got {w.bits} bits, group {w.group}, K {k}"
        )
    if k % BLOCK_K:
        raise ValueError(f"K ({k}) must be a multiple of {BLOCK_K}")
    if bias is not None and (bias.shape != (n,) or not bias.is_contiguous()):
        raise ValueError(f"bias must be contiguous [{n}]")
    if packed:
        return packed_matmul(x, w, bias)
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    plan = plan_for(n, k, target_programs(x.device), wide_steps(x.dtype, x.device))
    partial = plan.split > 1 and m <= SMALL_M
    # bf16/fp16: tensor-core tiles of 16 to 256 rows and of 32 to 256 columns give a row the
    # same bits (checked on the H200: bench.kernels.check, bench_prefill_tiles), so 17-64 rows
    # read each weight tile once, in one 64-row tile, and prefill runs large tiles with deeper
    # pipelining (through tensor descriptors on Hopper); fp32 products are FMA loops whose order
    # follows the tile, so fp32 keeps one tile shape.
    launch = {}
    block_m, block_n = 16 if m <= 16 or x.dtype == torch.float32 else 64, plan.block_n
    if not partial and m > SMALL_M and x.dtype != torch.float32 and not interpreting():
        block_m, block_n = 128, 128
        launch = dict(num_warps=8, num_stages=_prefill_stages(x.device))
    block_k = plan.decode_block_k if m <= SMALL_M else BLOCK_K
    grid_mn = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    parts, grid, counters = split_buffers(out, plan.split, partial, grid_mn)
    tiles = None if partial or m <= SMALL_M else prefill_tiles_for(x, w)
    if tiles is not None:
        matmul_tiles(x, w, bias, out, plan.split, tiles)
        return out
    _matmul_kernel[grid](
        x,
        w,
        bias if bias is not None else out,
        out,
        parts,
        counters,
        m,
        n,
        k,
        x.stride(0),
        w.stride(0),
        SEG_K=k // plan.split,
        SPLIT=plan.split,
        PARTIAL=partial,
        HAS_BIAS=bias is not None,
        UPCAST=interpreting() or x.dtype == torch.float32,
        ROW_STABLE=interpreting(),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        **launch,
        **pdl_launch(x.device),
    )
    return out


@functools.cache
def _prefill_stages(device: torch.device) -> int:
    """Pipeline stages for the 128 x 128 prefill tiles: 4 (128 KB of shared memory) where Hopper's
    228 KB allow it, 2 elsewhere."""
    return 4 if torch.cuda.get_device_capability(device)[0] >= 9 else 2


def ref_matmul(x: torch.Tensor, w, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The same math in plain torch (fp32 accumulation; a PackedWeight dequantized first)."""
    if isinstance(w, PackedWeight):
        w = w.rows(0, w.shape[0])
    out = x.float() @ w.float().T
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype)
