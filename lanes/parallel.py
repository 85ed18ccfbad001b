"""Tensor parallelism over torch.distributed (gloo on the CPU, NCCL on GPUs).

Design: one controller. Rank 0 runs the whole Engine (admission, rounds, share allocator,
prompt cache, sampling, drafter); every rank holds a shard of the target and its own shard of
every KV block, at the same slots. For each forward, rank 0 broadcasts the ForwardBatch; all
ranks run their shard on it; logits are gathered. Because block ids and slots are rank 0's and
identical everywhere, a block rank 0 publishes to the prompt cache (cancel_prefill) is a snapshot
of that block on every rank at once: there is no second copy of the cache to keep in step.

Shards: column-parallel q/k/v (by heads, KV heads too) and gate/up (by intermediate), row-parallel
o and down (by input), vocab-parallel embedding and LM head. Mixture-of-experts layers: every
expert (and the shared one) split by its intermediate width like a dense MLP, the router whole on
every rank, so every rank routes a token alike and the weighted sum of its experts is a partial
sum like a dense down projection's. Exact mode needs reductions whose
order never depends on the number of tokens: `Comm.all_reduce` gathers every rank's partial and
sums them in rank order (collectives pick their own algorithms by message size; this does not).
The drafter runs on rank 0 alone, unsharded: drafters are small, and their tokens only need to
be the same on the rank that verifies them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.distributed as dist

from lanes.batch import unpack_batch
from lanes.config import ConfigError, ModelConfig
from lanes.models.weights import DecoderWeights
from lanes.packed import PackedWeight


class Comm:
    """The collectives a sharded forward needs, with a fixed reduction order."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over ranks in rank order: ((r0 + r1) + r2) + ..., the same for any shape."""
        parts = [torch.empty_like(x) for _ in range(self.world)]
        dist.all_gather(parts, x.contiguous())
        total = parts[0]
        for p in parts[1:]:
            total = total + p
        return total

    def gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate each rank's slice of the last dimension (vocab-parallel logits)."""
        parts = [torch.empty_like(x) for _ in range(self.world)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=-1)

    def broadcast(self, obj: Any) -> Any:
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]


def shard_config(cfg: ModelConfig, world: int) -> ModelConfig:
    if cfg.is_hybrid:
        raise ConfigError(f"tensor parallel {world}: hybrid (DeltaNet) models run on one GPU")
    split = ["num_heads", "num_kv_heads", "intermediate_size", "vocab_size"]
    if cfg.is_moe:  # every expert split by its intermediate width, as a dense MLP is
        split += ["moe_intermediate_size", "shared_expert_intermediate_size"]
    for name in split:
        if getattr(cfg, name) % world:
            raise ConfigError(
                f"tensor parallel {world}: {name} ({getattr(cfg, name)}) is not divisible"
            )
    return dataclasses.replace(cfg, **{name: getattr(cfg, name) // world for name in split})


def shard_weights(w: DecoderWeights, cfg: ModelConfig, rank: int, world: int) -> DecoderWeights:
    """This rank's slices of the full (fused) weights."""
    if isinstance(w.embed, PackedWeight) or isinstance(w.layers[0].qkv, PackedWeight):
        raise ConfigError(f"tensor parallel {world}: quantized (packed) weights run on one GPU")

    def part(t: torch.Tensor, dim: int) -> torch.Tensor:
        return t.chunk(world, dim=dim)[rank].contiguous()

    def qkv_part(t: torch.Tensor) -> torch.Tensor:
        q, k, v = t.split([cfg.q_size, cfg.kv_size, cfg.kv_size], dim=0)
        return torch.cat([part(q, 0), part(k, 0), part(v, 0)]).contiguous()

    def gate_up_part(t: torch.Tensor | None, dim: int = 0) -> torch.Tensor | None:
        """Column-parallel [gate; up] (along `dim`): this rank's gate rows, then its up rows."""
        if t is None:
            return None
        gate, up = t.chunk(2, dim=dim)
        return torch.cat([part(gate, dim), part(up, dim)], dim=dim).contiguous()

    def row_part(t: torch.Tensor | None, dim: int = 1) -> torch.Tensor | None:
        return None if t is None else part(t, dim)

    layers = []
    for layer in w.layers:
        # router, its bias and the shared expert's gate stay whole: every rank routes alike
        layers.append(
            dataclasses.replace(
                layer,
                qkv=qkv_part(layer.qkv),
                qkv_bias=qkv_part(layer.qkv_bias) if layer.qkv_bias is not None else None,
                o=part(layer.o, 1),
                gate_up=gate_up_part(layer.gate_up),
                down=row_part(layer.down),
                experts_gate_up=gate_up_part(layer.experts_gate_up, 1),  # [E, 2I, hidden]
                experts_down=row_part(layer.experts_down, 2),  # [E, hidden, I]
                shared_gate_up=gate_up_part(layer.shared_gate_up),
                shared_down=row_part(layer.shared_down),
            )
        )
    embed = part(w.embed, 0)
    lm_head = embed if w.lm_head is w.embed else part(w.lm_head, 0)
    return DecoderWeights(embed=embed, layers=layers, norm=w.norm, lm_head=lm_head)


def worker_loop(runner, comm: Comm, device: str) -> None:
    """Ranks > 0: run every forward rank 0 announces, until it says stop (None)."""
    while True:
        packed = comm.broadcast(None)
        if packed is None:
            return
        runner.decoder.forward(unpack_batch(packed, device), runner.kv)
