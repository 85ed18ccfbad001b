"""The model runner: turns a LaneRound into one flat ForwardBatch and runs the target on it."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lanes.batch import ForwardBatch, SeqSlice, fill_pending
from lanes.cache.kv_pool import KVPool
from lanes.models.decoder import Decoder
from lanes.rounds import Step


class ModelRunner:
    def __init__(self, decoder: Decoder, kv: KVPool, device: str, graphs=None) -> None:
        self.decoder = decoder
        self.kv = kv
        self.num_blocks = kv.num_blocks - 1  # blocks the engine hands out (see build_runner)
        self.device = device
        self.graphs = graphs  # DecodeGraphs, or None: every forward runs eagerly
        self.comm = decoder.comm  # tensor parallel: rank 0 announces each forward to the others
        # the latest forward's final-norm rows, step after step (num_tokens rows per step); a
        # view the next forward overwrites: take copies of what must outlive it
        self.last_hidden: torch.Tensor | None = None

    def build_batch(
        self,
        steps: Sequence[Step],
        all_logits: bool = False,
        previous_tokens: torch.Tensor | None = None,
    ) -> ForwardBatch:
        """Every step's tokens, one after another; logits rows: each step's trailing
        `num_logits` rows (or every row, with `all_logits`). A step with a `pending_row` takes
        its first token from previous_tokens [rows of the previous forward], on the device."""
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        seqs: list[SeqSlice] = []
        logits_rows: list[int] = []
        for step in steps:
            lane, n = step.lane, step.end - step.start
            context_slots = lane.block_table.slots(0, step.end)
            seqs.append(
                SeqSlice(
                    query_start=len(ids),
                    num_queries=n,
                    context_len=step.end,
                    kv_slots=_to_device(context_slots, self.device),
                    state_slot=getattr(lane, "state_slot", -1),
                    keep_states=step.num_logits > 1,
                )
            )
            ids.extend(step.token_ids())
            positions.extend(range(step.start, step.end))
            slots.extend(context_slots[step.start :])
            wanted = n if all_logits else step.num_logits
            logits_rows.extend(range(len(ids) - wanted, len(ids)))

        def t(values: list[int]) -> torch.Tensor:
            return _to_device(values, self.device)

        input_ids = t(ids)
        fill_pending(input_ids, [seq.query_start for seq in seqs], steps, previous_tokens)
        features = None
        if any(s.features is not None for s in steps):
            features = torch.cat([s.features for s in steps]).to(self.device)
        return ForwardBatch(
            input_ids=input_ids,
            positions=t(positions),
            slot_mapping=t(slots),
            seqs=tuple(seqs),
            logits_indices=t(logits_rows),
            features=features,
        )

    def catch_up_logits(self, num_tokens: int) -> int:
        """Logits rows a drafter's catch-up step of `num_tokens` rows should ask for when it
        needs only the last: with CUDA graphs every row (a step whose rows all yield logits fits
        a graph bucket instead of running eagerly), else just the last."""
        graphed = self.graphs is not None and num_tokens <= self.graphs.max_tokens_per_lane
        return num_tokens if graphed else 1

    def execute(
        self,
        steps: Sequence[Step],
        all_logits: bool = False,
        previous_tokens: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One forward over the steps; returns logits [num_logits_rows, vocab] in step order.
        previous_tokens: the previous forward's samples on the device, which steps with a
        `pending_row` read their first token from (the overlap of rounds)."""
        if self.graphs is not None and not all_logits and self.graphs.supports(steps):
            logits = self.graphs.run(steps, previous_tokens)
            self.last_hidden = self.graphs.last_hidden
            return logits
        if self.comm is not None and previous_tokens is not None:
            raise ValueError("tensor parallel ranks read input ids from the host: no pending rows")
        batch = self.build_batch(steps, all_logits, previous_tokens)
        if self.comm is not None:
            from lanes.batch import pack_batch

            self.comm.broadcast(pack_batch(batch))
        logits = self.decoder.forward(batch, self.kv)
        self.last_hidden = self.decoder.last_hidden
        return logits


def _to_device(values: list[int], device: str) -> torch.Tensor:
    """An int64 tensor on the device, copied without waiting: a blocking copy would wait for
    the forward still in flight (overlapped rounds)."""
    return torch.tensor(values, dtype=torch.int64).to(device, non_blocking=True)


def build_runner(decoder: Decoder, num_blocks: int, config, dtype: torch.dtype) -> ModelRunner:
    """A runner with its KV pool and, on CUDA with Triton ops, CUDA graphs for decode.

    The pool holds one block more than the block pool hands out: the scratch block that
    CUDA-graph padding lanes write to.
    """
    mc, bs = decoder.cfg, config.block_size
    kv = KVPool(
        len(mc.attention_layers),
        num_blocks + 1,
        bs,
        mc.num_kv_heads,
        mc.head_dim,
        dtype,
        config.device,
    )
    if mc.is_hybrid:  # one recurrent-state slot per lane that can run
        from lanes.cache.state_pool import StatePool
        from lanes.models.deltanet import deltanet_state_shapes

        conv, state = deltanet_state_shapes(mc)
        kv.states = StatePool(config.max_lanes, len(mc.linear_layers), conv, state, config.device)
    graphs = None
    if (
        config.cuda_graphs
        and config.device.startswith("cuda")
        and decoder.ops.name == "triton"
        and decoder.comm is None
        and not mc.is_moe  # routing reads which experts a batch uses on the host: not capturable
        and not mc.is_hybrid  # the recurrence loops over each lane's rows on the host
    ):
        from lanes.graphs import DecodeGraphs

        max_ctx = min(mc.max_position_embeddings, num_blocks * bs)
        graphs = DecodeGraphs(decoder, kv, scratch_slot=num_blocks * bs, max_ctx=max_ctx)
    return ModelRunner(decoder, kv, config.device, graphs)
