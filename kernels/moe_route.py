"""A mixture-of-experts layer's routing and its weighted sum, one launch each, batch-invariant.

`route_experts`: each token's router logits -> fp32 softmax -> its k best experts (ties to the
lower expert id) and their weights, renormalised to sum to 1 if asked. One program per token,
so a token's choice and weights never depend on the batch. It replaces a softmax, a stable sort
of every expert and the slicing and sums after it (on a Qwen3.5-35B-A3B-like decode step the
sorts alone took 0.86 ms of 8.31 ms: issue 45). The bits of the weights are this kernel's own,
not torch's softmax's: everything that routes on the GPU routes here.

`combine_experts`: a token's k expert outputs summed by its weights in its own rank order, with
every product and sum rounded to the dtype as torch's elementwise ops round them, none fused
into an fma (the
`total = total + out_j * w_j` loop of lanes/models/moe.py): the same bits in one launch instead
of 2k - 1.
"""

from __future__ import annotations

import torch

from lanes.kernels.common import check, pdl_launch, unfused_launch, wait_for_inputs
from lanes.kernels.triton_shim import tl, triton

BLOCK_H = 1024  # hidden columns per program of the weighted sum


@triton.jit
def _route_kernel(
    logits_ptr, weights_ptr, experts_ptr, num_experts, stride,
    K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, NORMALISE: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    wait_for_inputs(PDL)
    token = tl.program_id(0)
    offs = tl.arange(0, BLOCK_E)
    live = offs < num_experts
    x = tl.load(logits_ptr + token * stride + offs, mask=live, other=float("-inf"))
    x = x.to(tl.float32)
    p = tl.exp(x - tl.max(x, axis=0))
    probs = tl.where(live, p / tl.sum(p, axis=0), -1.0)  # below every probability: never chosen
    ranks = tl.arange(0, BLOCK_K)
    chosen_w = tl.zeros((BLOCK_K,), dtype=tl.float32)
    chosen_e = tl.zeros((BLOCK_K,), dtype=tl.int64)
    for j in tl.static_range(K):
        best = tl.max(probs, axis=0)
        # the lowest id among equal best probabilities
        pick = tl.min(tl.where(probs == best, offs, BLOCK_E), axis=0)
        chosen_w = tl.where(ranks == j, best, chosen_w)
        chosen_e = tl.where(ranks == j, pick.to(tl.int64), chosen_e)
        probs = tl.where(offs == pick, -1.0, probs)
    if NORMALISE:
        chosen_w = chosen_w / tl.sum(chosen_w, axis=0)  # ranks past K hold 0
    out = token * K + ranks
    tl.store(weights_ptr + out, chosen_w, mask=ranks < K)
    tl.store(experts_ptr + out, chosen_e, mask=ranks < K)


def route_experts(
    router_logits: torch.Tensor, k: int, normalise: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights fp32 [n, k], expert ids int64 [n, k]) from router logits [n, E], best first."""
    check(router_logits.dim() == 2, f"router logits must be [n, E], got {router_logits.shape}")
    n, e = router_logits.shape
    check(1 <= k <= e, f"cannot choose {k} of {e} experts")
    logits = router_logits if router_logits.stride(1) == 1 else router_logits.contiguous()
    weights = torch.empty((n, k), dtype=torch.float32, device=logits.device)
    experts = torch.empty((n, k), dtype=torch.int64, device=logits.device)
    if n:
        _route_kernel[(n,)](
            logits, weights, experts, e, logits.stride(0),
            K=k, BLOCK_E=triton.next_power_of_2(e), BLOCK_K=triton.next_power_of_2(k),
            NORMALISE=normalise, **pdl_launch(logits.device),
        )  # fmt: skip
    return weights, experts


def ref_route_experts(
    router_logits: torch.Tensor, k: int, normalise: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same routing in torch: a stable sort of the softmax (lanes/models/moe.py's route)."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    ranked = torch.sort(probs, dim=-1, descending=True, stable=True)
    weights, experts = ranked.values[:, :k], ranked.indices[:, :k]
    if normalise:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, experts


@triton.jit
def _combine_kernel(
    outputs_ptr, weights_ptr, total_ptr, hidden,
    K: tl.constexpr, BLOCK_H: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    wait_for_inputs(PDL)
    token = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = cols < hidden
    dtype = total_ptr.dtype.element_ty
    row = outputs_ptr + token * K * hidden + cols
    w = tl.load(weights_ptr + token * K).to(tl.float32)
    total = (tl.load(row, mask=mask, other=0.0).to(tl.float32) * w).to(dtype).to(tl.float32)
    for j in tl.static_range(1, K):
        w = tl.load(weights_ptr + token * K + j).to(tl.float32)
        out = tl.load(row + j * hidden, mask=mask, other=0.0).to(tl.float32)
        total = (total + (out * w).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
    tl.store(total_ptr + token * hidden + cols, total.to(dtype), mask=mask)


def combine_experts(outputs: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """outputs [n * k, hidden] (row t * k + j: token t's j-th expert), weights [n, k] in the
    outputs' dtype -> [n, hidden]: each token's sum over j of outputs * weights, in rank order."""
    n, k = weights.shape
    check(
        outputs.dim() == 2 and outputs.shape[0] == n * k and outputs.is_contiguous(),
        f"outputs must be contiguous [n * k, hidden] for weights {tuple(weights.shape)}",
    )
    check(weights.dtype == outputs.dtype, f"weights {weights.dtype}, outputs {outputs.dtype}")
    hidden = outputs.shape[1]
    weights = weights.contiguous()
    total = torch.empty((n, hidden), dtype=outputs.dtype, device=outputs.device)
    if n:
        _combine_kernel[(n, triton.cdiv(hidden, BLOCK_H))](
            outputs, weights, total, hidden, K=k, BLOCK_H=BLOCK_H,
            **pdl_launch(outputs.device), **unfused_launch(),
        )  # fmt: skip
    return total


def ref_combine_experts(outputs: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The same sum as torch ops, as lanes/models/moe.py runs it on the other paths."""
    n, k = weights.shape
    view = outputs.view(n, k, -1)
    total = view[:, 0] * weights[:, :1]
    for j in range(1, k):
        total = total + view[:, j] * weights[:, j : j + 1]
    return total
