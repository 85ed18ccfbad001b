"""Grouped expert linear for mixture-of-experts layers: every (token, chosen expert) pair of a
forward through its expert's weight in one launch, with no host read of the routing.

A forward's routing gives each token its k experts: slot s = token * k + rank. The slots are
grouped by expert on the device (`expert_tiles`: a stable sort, counts, and a fixed-size table of
BLOCK_M-slot tiles, each inside one expert's group), so the launch's grid depends only on the
number of slots and experts, never on which experts were chosen: a CUDA graph can replay it.
Tiles past the last used one have no slots and return at once.

Batch-invariant: a slot's output is its row times its expert's weight, reduced over K in
BLOCK_K blocks in ascending order into one accumulator, whatever other slots share its tile or
how many tokens chose that expert. Tile shapes are fixed (BLOCK_M x BLOCK_N by the weight's
width), so the fp32 products' FMA order never changes either.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lanes.kernels.common import (
    FLOAT_DTYPES,
    check,
    fp32_dot,
    interpreting,
    pdl_launch,
    wait_for_inputs,
)
from lanes.kernels.triton_shim import tl, triton

BLOCK_M = 16  # slots per tile: decode routes one to a few tokens per expert
BLOCK_K = 64


@dataclass(frozen=True)
class ExpertTiles:
    """Slots grouped by expert, as tiles of at most BLOCK_M slots of one expert each; plain
    device tensors of a size fixed by (slots, experts). Made once per layer, used by both of the
    experts' projections."""

    order: torch.Tensor  # int64 [S]: slot ids, grouped by expert (ascending slot within)
    expert: torch.Tensor  # int32 [T]: each tile's expert
    first: torch.Tensor  # int32 [T]: each tile's first index into `order`
    count: torch.Tensor  # int32 [T]: slots in the tile (0: an unused tile)


def expert_tiles(experts: torch.Tensor, num_experts: int) -> ExpertTiles:
    """The tile table for slots whose experts are `experts` (int [S]), on the device."""
    check(experts.dim() == 1, f"experts must be [slots], got {tuple(experts.shape)}")
    slots, dev = experts.numel(), experts.device
    chosen = experts.long()
    order = torch.sort(chosen, stable=True).indices
    # scatter_add_ rather than bincount: bincount reads the largest id on the host
    counts = torch.zeros(num_experts, dtype=torch.int64, device=dev)
    counts.scatter_add_(0, chosen, torch.ones_like(chosen))
    tiles = (counts + BLOCK_M - 1) // BLOCK_M
    tile_end = tiles.cumsum(0)
    slot_start = counts.cumsum(0) - counts
    # at most one partial tile per expert used: sum(ceil(c / B)) <= S / B + min(E, S)
    most = triton.cdiv(slots, BLOCK_M) + min(num_experts, slots)
    t = torch.arange(most, device=dev)
    expert = torch.searchsorted(tile_end, t, right=True).clamp_(max=num_experts - 1)
    within = t - (tile_end[expert] - tiles[expert])  # the tile's place in its expert's group
    count = (counts[expert] - within * BLOCK_M).clamp_(0, BLOCK_M)  # 0 past the last tile
    first = slot_start[expert] + within * BLOCK_M
    return ExpertTiles(order, expert.to(torch.int32), first.to(torch.int32), count.to(torch.int32))


@triton.jit
def _expert_matmul_kernel(
    x_ptr,  # [R, K]: slot s reads row s // ROWS_PER_SLOT
    w_ptr,  # [E, N, K]
    out_ptr,  # [S, N]
    order_ptr,
    expert_ptr,
    first_ptr,
    count_ptr,
    N,
    K,
    stride_xm,
    stride_we,
    stride_wn,
    ROWS_PER_SLOT: tl.constexpr,
    UPCAST: tl.constexpr,  # compute in fp32 (fp32 models and the CPU interpreter)
    ROW_STABLE: tl.constexpr,  # the interpreter: see common.fp32_dot
    EVEN_K: tl.constexpr,  # K a multiple of BLOCK_K
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    tile = tl.program_id(0)
    pid_n = tl.program_id(1)
    wait_for_inputs(PDL)
    count = tl.load(count_ptr + tile)
    if count > 0:
        expert = tl.load(expert_ptr + tile).to(tl.int64)
        first = tl.load(first_ptr + tile)
        i = tl.arange(0, BLOCK_M)
        mask_m = i < count
        slots = tl.load(order_ptr + first + i, mask=mask_m, other=0)
        rows = slots // ROWS_PER_SLOT
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        mask_n = rn < N
        rk = tl.arange(0, BLOCK_K)
        w_tile = w_ptr + expert * stride_we + rn[:, None] * stride_wn
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kb in range(0, K, BLOCK_K):  # K is a runtime value: always a loop (see matmul.py)
            k = kb + rk
            if EVEN_K:  # real models' widths: no mask along K (fewer registers)
                a = tl.load(
                    x_ptr + rows[:, None] * stride_xm + k[None, :], mask=mask_m[:, None], other=0.0
                )
                b = tl.load(w_tile + k[None, :], mask=mask_n[:, None], other=0.0)
            else:
                mask_k = k < K
                a = tl.load(
                    x_ptr + rows[:, None] * stride_xm + k[None, :],
                    mask=mask_m[:, None] & mask_k[None, :],
                    other=0.0,
                )
                b = tl.load(w_tile + k[None, :], mask=mask_n[:, None] & mask_k[None, :], other=0.0)
            if UPCAST:  # a true fp32 product, no TF32
                acc = fp32_dot(a.to(tl.float32), tl.trans(b.to(tl.float32)), acc, ROW_STABLE)
            else:
                acc = tl.dot(a, tl.trans(b), acc)
        tl.store(
            out_ptr + slots[:, None] * N + rn[None, :],
            acc.to(out_ptr.dtype.element_ty),
            mask=mask_m[:, None] & mask_n[None, :],
        )


def expert_matmul(
    x: torch.Tensor, w: torch.Tensor, tiles: ExpertTiles, rows_per_slot: int
) -> torch.Tensor:
    """out [S, N]: slot s's row x[s // rows_per_slot] [K] @ w[its expert] [N, K].T, in x's
    dtype with fp32 accumulation. rows_per_slot is the routing's k for the tokens' hidden states
    (each token read by its k slots) and 1 for activations already in slot order."""
    check(x.dim() == 2 and w.dim() == 3, f"x [R, K] and w [E, N, K], got {x.shape}, {w.shape}")
    check(x.shape[1] == w.shape[2], f"K differs: x {tuple(x.shape)}, w {tuple(w.shape)}")
    check(x.dtype == w.dtype and x.dtype in FLOAT_DTYPES, f"dtypes: x {x.dtype}, w {w.dtype}")
    check(x.stride(1) == 1 and w.stride(2) == 1, "expert_matmul needs unit stride along K")
    slots = tiles.order.numel()
    check(x.shape[0] * rows_per_slot == slots, f"{slots} slots for {x.shape[0]} rows")
    _, n, k = w.shape
    out = torch.empty((slots, n), dtype=x.dtype, device=x.device)
    if slots == 0:
        return out
    block_n = 64 if n >= 64 else 32
    grid = (tiles.count.numel(), triton.cdiv(n, block_n))
    _expert_matmul_kernel[grid](
        x,
        w,
        out,
        tiles.order,
        tiles.expert,
        tiles.first,
        tiles.count,
        n,
        k,
        x.stride(0),
        w.stride(0),
        w.stride(1),
        ROWS_PER_SLOT=rows_per_slot,
        UPCAST=interpreting() or x.dtype == torch.float32,
        ROW_STABLE=interpreting(),
        EVEN_K=k % BLOCK_K == 0,
        BLOCK_M=BLOCK_M,
        BLOCK_N=block_n,
        BLOCK_K=BLOCK_K,
        **pdl_launch(x.device),
    )
    return out


def ref_expert_matmul(x: torch.Tensor, w: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    """The same in plain torch from the routing itself (experts [n, k] for x [n, K]), slot by
    slot in fp32: out [n * k, N]."""
    rows = x.repeat_interleave(experts.shape[1], dim=0).float()
    return torch.einsum("sk,snk->sn", rows, w[experts.reshape(-1)].float()).to(x.dtype)
