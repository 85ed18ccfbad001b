"""How a linear's K reduction is cut for one weight: the split-K plan both matmul kernels (float
weights in matmul.py, affine codes in packed_matmul.py) follow, and the tile store they end with.

A plan is a function of the weight's shape and the device, never of M: that is what keeps a
row's bits independent of the batch.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from lanes.kernels.common import interpreting, tickets
from lanes.kernels.triton_shim import tl, triton

BLOCK_K = 64
WIDE_BLOCK_K = 128  # decode's K step where a segment and the launch allow (plan_for)
SMALL_M = 64  # up to this many rows: parallel segments
_MAX_SPLIT = 16
# a segment shorter than this many columns costs more in partials and arrival counting than its
# parallelism buys (H200, bench_matmul: SmolLM2's K = 576 weights run fastest unsplit)
_MIN_SEGMENT = 4 * BLOCK_K
_INTERPRETER_PROGRAMS = 4  # the CPU interpreter runs programs one by one: keep them few


@dataclass(frozen=True)
class Plan:
    """How a weight of shape [n, k] is tiled on one device: never a function of M."""

    block_n: int  # output columns per program
    split: int  # segments of the K reduction (divides k / step)
    decode_block_k: int = BLOCK_K  # K per step at <= SMALL_M rows


@functools.cache
def target_programs(device: torch.device) -> int:
    """Programs a decode GEMV should spread over: two per SM (264 on an H200)."""
    if interpreting() or device.type != "cuda":
        return _INTERPRETER_PROGRAMS
    return 2 * torch.cuda.get_device_properties(device).multi_processor_count


def wide_steps(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether a float weight's decode programs may walk K 128 wide: tensor-core tiles only (fp32
    products and the interpreter's row-stable dot are loops whose order follows the tile's K)
    on a GPU whose shared memory holds the stages."""
    return dtype != torch.float32 and not interpreting() and _wide_steps_fit(device)


@functools.cache
def plan_for(n: int, k: int, target: int, wide: bool = False, step: int = BLOCK_K) -> Plan:
    """Enough programs to fill the GPU at decode: 64-column tiles unless the weight is too narrow
    to reach the target even at the largest split, then 32. The split is a divisor of the K
    steps (`step` columns each) leaving segments of at least _MIN_SEGMENT columns (K = 14336's
    224 64-wide steps split in 2, 4, 7, 8, 14 or 16). With `wide` (see wide_steps): the
    smallest whose segments a decode program can walk 128 wide and whose programs come within a
    quarter of the target; where none does, or without `wide`, the smallest that reaches the
    target (else the largest), walked `step` wide.

    Measured on the H200 with no weight in L2 (results/session14-h200/call1): with 128-wide
    steps fewer, longer segments stream better (o 12.5 us in 8 segments -> 11.8 in 4, down 32.1
    in 7 -> 30.8 in 4), with 64-wide steps it goes the other way (13.4 and 36.5 in 4); lm_head
    252 -> 233 us; and prefill's tiles add fewer segments (down at M = 8,192: 1,404 -> 1,272
    us). The tensor cores add their 16-wide K chunks into the accumulator in ascending order at
    either width, so every row keeps its bits (bench.kernels.check's rows of M = 1, 37, 64, 128
    against M = 4,096 for the 8B and SmolLM2 projections, the sweep's for lm_head)."""
    steps = k // step
    most = max(1, min(k // _MIN_SEGMENT, steps, _MAX_SPLIT))
    divisors = [d for d in range(1, most + 1) if steps % d == 0]
    block_n = 64
    if triton.cdiv(n, 64) * divisors[-1] < target:
        block_n = 32
    tiles = triton.cdiv(n, block_n)
    if wide:
        enough = target - target // 4
        for d in divisors:
            if (k // d) % WIDE_BLOCK_K == 0 and tiles * d >= enough:
                return Plan(block_n, d, WIDE_BLOCK_K)
    split = next((d for d in divisors if tiles * d >= target), divisors[-1])
    return Plan(block_n, split, step)


@functools.cache
def _wide_steps_fit(device: torch.device) -> bool:
    """Whether 64 x 64 tiles with 128-wide K steps, three stages deep (96 KB of shared memory),
    fit a program here: Hopper's 228 KB do (the only GPU they were measured on); the 100 KB of
    consumer Ampere and Ada would not leave room, so those keep 64-wide steps."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


@triton.jit
def store_tile(total, bias_ptr, out_ptr, out_offs, rn, mask, mask_n, HAS_BIAS: tl.constexpr):
    """The fp32 tile (+ bias) in the output's dtype."""
    if HAS_BIAS:
        total += tl.load(bias_ptr + rn, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + out_offs, total.to(out_ptr.dtype.element_ty), mask=mask)


def split_buffers(
    out: torch.Tensor, split: int, partial: bool, grid_mn: tuple[int, int]
) -> tuple[torch.Tensor, tuple[int, ...], torch.Tensor]:
    """(partials, grid, tickets) for a launch over grid_mn = (row tiles, column tiles) writing
    `out` [M, N]: with `partial`, an fp32 [split, M, N] partial per segment and a segment per
    program (grid axis 2); else `out` stands in as the unused partials. The tickets are asked
    for on every call, so the first matmul on a device (eager, before any graph) makes them."""
    counters = tickets(out.device, grid_mn[0] * grid_mn[1] if partial else 0, "matmul")
    if not partial:
        return out, grid_mn, counters
    m, n = out.shape
    parts = torch.empty((split, m, n), dtype=torch.float32, device=out.device)
    return parts, (*grid_mn, split), counters


@triton.jit
def segments(PARTIAL: tl.constexpr, SPLIT: tl.constexpr):
    """The K segments [first, last) this program reduces: its own (program axis 2) with
    PARTIAL, else all of them."""
    if PARTIAL:
        first = tl.program_id(2)
        last = first + 1
    else:
        first = 0
        last = SPLIT
    return first, last


@triton.jit
def finish_tile(
    total, part_ptr, ticket_ptr, bias_ptr, out_ptr, first, M, N, rm, rn, mask_m, mask_n,
    SPLIT: tl.constexpr, PARTIAL: tl.constexpr, HAS_BIAS: tl.constexpr,
):  # fmt: skip
    """A program's fp32 tile [BLOCK_M, BLOCK_N] of rows rm and columns rn: stored, or with
    PARTIAL (one segment, `first`, per program) stored as a partial, and the tile's last program
    to arrive (a ticket per tile) adds the SPLIT partials in ascending order and stores the
    tile: the same sums as one program adding its segments in order."""
    mask = mask_m[:, None] & mask_n[None, :]
    out_offs = rm[:, None] * N + rn[None, :]
    if PARTIAL:
        tl.store(part_ptr + first * M * N + out_offs, total, mask=mask)
        # every thread's share of the partial is stored (the barrier) before one thread counts
        # the arrival with release semantics; the last arrival acquires, so it sees them all
        tl.debug_barrier()
        tile = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
        arrived = tl.atomic_add(ticket_ptr + tile, 1, sem="acq_rel")
        if arrived == SPLIT - 1:
            total = tl.zeros_like(total)
            for s in range(SPLIT):  # ascending: the same sums as the one-program path
                total += tl.load(
                    part_ptr + s * M * N + out_offs, mask=mask, other=0.0, cache_modifier=".cg"
                )
            tl.atomic_xchg(ticket_ptr + tile, 0)
            store_tile(total, bias_ptr, out_ptr, out_offs, rn, mask, mask_n, HAS_BIAS)
    else:
        store_tile(total, bias_ptr, out_ptr, out_offs, rn, mask, mask_n, HAS_BIAS)
