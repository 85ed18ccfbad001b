"""The mixture-of-experts MLP (Qwen3-MoE, Qwen3.5-MoE), batch-invariant.

A router scores the experts for each token (softmax in fp32); the token goes to its
`experts_per_token` best (ties broken towards the lower expert id, so the choice never depends
on sort internals), optionally with the chosen weights renormalised to sum to 1
(`Ops.route_experts`; on the GPU one launch, kernels/moe_route.py). Each expert is
a SiLU MLP run on the rows routed to it. What keeps it batch-invariant: the expert linears are
row-independent (a row's result does not depend on how many other rows chose that expert:
`Ops.experts`; on the GPU one grouped launch per projection, kernels/expert_matmul.py), and
each token sums its experts' outputs in its own rank order, not in an order set by the batch.
"""

from __future__ import annotations

import torch

from lanes.config import ModelConfig
from lanes.models.weights import LayerWeights
from lanes.ops import Ops

# Elementwise exp/sigmoid on the CPU runs SIMD over whole vectors and scalar code over a tensor's
# tail, which round differently: a row of 8 experts landing in the tail would get other bits than
# the same row elsewhere. Each row padded to this many columns makes every row whole vectors.
_ROW_WIDTH = 64


def _rowwise_sigmoid(x: torch.Tensor) -> torch.Tensor:
    """sigmoid(x) [n, e] whose row bits do not depend on the row's place in the tensor."""
    pad = (-x.shape[1]) % _ROW_WIDTH
    return torch.sigmoid(torch.nn.functional.pad(x, (0, pad)))[:, : x.shape[1]]


def route_groups(
    router_logits: torch.Tensor, bias: torch.Tensor, k: int, cfg: ModelConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """GLM-4 MoE's routing, per row: sigmoid scores; the choice reads score + bias; the experts
    fall in n_group groups, each group worth its two best choice values, and only the topk_group
    best groups compete; the k best of those (ties towards the lower id, for groups and experts
    alike) take their scores (without the bias) as weights, renormalised if asked, times
    routed_scaling_factor. (weights fp32 [n, k], expert ids [n, k]), best first."""
    scores = _rowwise_sigmoid(router_logits.float())
    choice = scores + bias
    n, groups = choice.shape[0], cfg.n_group
    grouped = choice.view(n, groups, -1)
    best_two = torch.sort(grouped, dim=-1, descending=True, stable=True).values[..., :2]
    group_rank = torch.sort(best_two.sum(dim=-1), dim=-1, descending=True, stable=True)
    keep = torch.zeros((n, groups), dtype=torch.bool, device=choice.device)
    keep.scatter_(1, group_rank.indices[:, : cfg.topk_group], True)
    allowed = keep.unsqueeze(-1).expand_as(grouped).reshape(n, -1)
    ranked = torch.sort(choice.masked_fill(~allowed, float("-inf")), dim=-1, descending=True,
                        stable=True)  # fmt: skip
    experts = ranked.indices[:, :k]
    weights = scores.gather(1, experts)
    if cfg.norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * cfg.routed_scaling_factor, experts


def moe_mlp(ops: Ops, x: torch.Tensor, layer: LayerWeights, cfg: ModelConfig) -> torch.Tensor:
    """x [n, hidden] -> [n, hidden]: each row's experts' outputs, weighted and summed."""
    k = cfg.experts_per_token
    logits = ops.linear(x, layer.router)
    if cfg.router == "sigmoid_groups":
        weights, experts = route_groups(logits, layer.router_bias, k, cfg)
    else:
        weights, experts = ops.route_experts(logits, k, cfg.norm_topk_prob)
    outputs = ops.experts(x, experts, layer.experts_gate_up, layer.experts_down)
    total = ops.combine_experts(outputs, weights.to(x.dtype))  # best expert first
    if layer.shared_gate_up is not None and layer.shared_gate is None:  # GLM-4 MoE: ungated
        return total + ops.glu_linear(ops.linear(x, layer.shared_gate_up), layer.shared_down)
    if layer.shared_gate_up is not None:  # Qwen3.5-MoE: + sigmoid(gate) * a shared SiLU MLP
        shared = ops.glu_linear(ops.linear(x, layer.shared_gate_up), layer.shared_down)
        # the gate's sigmoid over a full row per token, not one value per token: a row's bits
        # must not depend on where in the tensor it sits (vectorised vs scalar tails)
        scale = torch.sigmoid(ops.linear(x, layer.shared_gate).expand_as(shared))
        total = total + scale * shared
    return total
