"""The model runner: turns one forward's LaneRows into a flat ForwardBatch and runs the model."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from lanes.batch import ForwardBatch, SeqSlice, fill_pending
from lanes.block_tables import BlockTables
from lanes.branch_scratch import BranchScratch
from lanes.cache.kv_pool import KVPool
from lanes.device_sampling import ParamsOnDevice
from lanes.lane_rows import LaneRows
from lanes.models.decoder import Decoder


class ModelRunner:
    def __init__(
        self,
        decoder: Decoder,
        kv: KVPool,
        device: str,
        tables: BlockTables,
        graphs=None,
        branches: BranchScratch | None = None,
        mixed=None,
    ) -> None:
        self.decoder = decoder
        self.kv = kv
        self.branches = branches  # where draft branches keep their KV (None: chains only)
        # blocks the engine hands out: the pool less the padding block and any branch scratch
        pooled = kv.num_blocks if branches is None else branches.base // kv.block_size
        self.num_blocks = pooled - 1
        self.device = device
        self.tables = tables  # every lane's blocks by slot, on the host and the device
        self.row_params = ParamsOnDevice()  # the sampled rows' parameters, on the device
        self.graphs = graphs  # DecodeGraphs, or None: every forward runs eagerly
        self.mixed = mixed  # MixedGraphs (decode rows beside a prompt chunk), or None
        self.comm = decoder.comm  # tensor parallel: rank 0 announces each forward to the others
        # the latest forward's final-norm rows, lane after lane (num_tokens rows each); a view
        # the next forward overwrites: take copies of what must outlive it
        self.last_hidden: torch.Tensor | None = None

    def build_batch(
        self,
        rows: Sequence[LaneRows],
        all_logits: bool = False,
        previous_tokens: torch.Tensor | None = None,
    ) -> ForwardBatch:
        """Every lane's tokens, one after another; logits rows: each lane's trailing
        `num_logits` rows (or every row, with `all_logits`). Rows with a `pending_row` take
        their first token from previous_tokens [rows of the previous forward], on the device.
        Context slots are gathered on the device from the block tables."""
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        logits_rows: list[int] = []
        firsts: list[int] = []
        reads: list[int] = []  # branch rows: the slots of [fork, end) they read, lane by lane
        for r in rows:
            firsts.append(len(ids))
            ids.extend(r.token_ids)
            positions.extend(range(r.start, r.end))
            if r.branch:
                slots.extend(self.branch_slots(r, range(r.start - r.fork, r.end - r.fork)))
                reads.extend(self._branch_reads(r))
            else:
                slots.extend(self.tables.row(r.slot).slots(r.start, r.end))
            wanted = r.num_tokens if all_logits else r.num_logits
            logits_rows.extend(range(len(ids) - wanted, len(ids)))
        # a branch's context: the lane's blocks before its fork, then its own slots
        context = self.tables.context_slots([(r.slot, r.fork if r.branch else r.end) for r in rows])
        staged = _to_device(ids + positions + slots + logits_rows + reads, self.device)
        n = len(ids)
        tail = staged[3 * n + len(logits_rows) :]
        seqs, at, read_at = [], 0, 0
        for r, first in zip(rows, firsts, strict=True):
            if r.branch:
                own = r.end - r.fork
                kv_slots = torch.cat([context[at : at + r.fork], tail[read_at : read_at + own]])
                at, read_at = at + r.fork, read_at + own
            else:
                kv_slots = context[at : at + r.end]
                at += r.end
            seqs.append(
                SeqSlice(
                    query_start=first,
                    num_queries=r.num_tokens,
                    context_len=r.end,
                    kv_slots=kv_slots,
                    state_slot=r.state_slot,
                    keep_states=r.keep_states,
                )
            )
        input_ids = staged[:n]
        fill_pending(input_ids, firsts, rows, previous_tokens)
        features = None
        if any(r.features is not None for r in rows):
            features = torch.cat([r.features for r in rows]).to(self.device)
        return ForwardBatch(
            input_ids=input_ids,
            positions=staged[n : 2 * n],
            slot_mapping=staged[2 * n : 3 * n],
            seqs=tuple(seqs),
            logits_indices=staged[3 * n : 3 * n + len(logits_rows)],
            features=features,
        )

    def branch_slots(self, r: LaneRows, offsets: range) -> list[int]:
        """The scratch slots of branch rows' positions r.fork + offsets."""
        if r.start < r.fork or self.branches is None:
            raise ValueError(f"branch rows [{r.start}, {r.end}) before their fork {r.fork}")
        return self.branches.slots(r.slot, r.branch, offsets)

    def _branch_reads(self, r: LaneRows) -> list[int]:
        """The slots a branch's rows read for positions [fork, end): its own (a test replaces
        this with a sibling's, the negative control of the tree tests)."""
        return self.branch_slots(r, range(r.end - r.fork))

    def adopt_branch(self, slot: int, branch: int, fork: int, positions: range) -> None:
        """A branch's KV at `positions` (kept by verification) moves into the lane's own slots
        there, every layer in one copy each for K and V."""
        if not positions or not branch:
            return
        offsets = range(positions.start - fork, positions.stop - fork)
        src = self.branches.slots(slot, branch, offsets)
        dst = self.tables.row(slot).slots(positions.start, positions.stop)
        index = torch.tensor([src, dst], dtype=torch.int64).to(self.device, non_blocking=True)
        for cache in (self.kv.k, self.kv.v):
            cache[:, index[1]] = cache[:, index[0]]

    def catch_up_logits(self, num_tokens: int) -> int:
        """Logits rows a drafter's catch-up step of `num_tokens` rows should ask for when it
        needs only the last: with CUDA graphs every row (a step whose rows all yield logits fits
        a graph bucket instead of running eagerly), else just the last."""
        graphed = self.graphs is not None and num_tokens <= self.graphs.max_tokens_per_lane
        return num_tokens if graphed else 1

    def execute(
        self,
        rows: Sequence[LaneRows],
        all_logits: bool = False,
        previous_tokens: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One forward over the lanes' rows; returns logits [num_logits_rows, vocab] in order.
        previous_tokens: the previous forward's samples on the device, which rows with a
        `pending_row` read their first token from (the overlap of rounds)."""
        for r in rows:
            self.tables.sync(r.slot, r.blocks)
        if self.graphs is not None and not all_logits:
            for graphs in (self.graphs, self.mixed):
                if graphs is not None and graphs.supports(rows):
                    logits = graphs.run(rows, previous_tokens)
                    self.last_hidden = graphs.last_hidden
                    return logits
        if self.comm is not None and previous_tokens is not None:
            raise ValueError("tensor parallel ranks read input ids from the host: no pending rows")
        batch = self.build_batch(rows, all_logits, previous_tokens)
        if self.comm is not None:
            from lanes.batch import pack_batch

            self.comm.broadcast(pack_batch(batch))
        logits = self.decoder.forward(batch, self.kv)
        self.last_hidden = self.decoder.last_hidden
        return logits


def _to_device(values: list[int], device: str) -> torch.Tensor:
    """An int64 tensor on the device, copied without waiting: a blocking copy would wait for
    the forward still in flight (overlapped rounds). Built through numpy: for an 8K-token chunk
    (24K values) torch.tensor took 2.0 ms of host time before the first kernel, fromiter 0.3."""
    host = np.fromiter(values, dtype=np.int64, count=len(values))
    return torch.from_numpy(host).to(device, non_blocking=True)


def build_runner(
    decoder: Decoder, num_blocks: int, config, dtype: torch.dtype, mixed_graphs: bool = False
) -> ModelRunner:
    """A runner with its KV pool and, on CUDA with Triton ops, CUDA graphs for decode (and
    with `mixed_graphs`, the engine's target: for decode rows beside a prompt chunk).

    The pool holds one block more than the block pool hands out: the scratch block that
    CUDA-graph padding lanes write to; and, with draft branches, their scratch slots after it
    (lanes/branch_scratch.py; attention-only models: a hybrid's recurrent state has no branches).
    """
    mc, bs = decoder.cfg, config.block_size
    branches = None
    if config.draft_branches > 1 and not mc.is_hybrid:
        depth = config.num_draft_tokens + 1  # the root and a branch's drafts
        base = (num_blocks + 1) * bs
        branches = BranchScratch(base, config.max_lanes, config.draft_branches, depth)
    extra = 0 if branches is None else -(-branches.num_slots(
        branches.num_lanes, branches.branches, branches.depth) // bs)  # fmt: skip
    kv = KVPool(
        len(mc.attention_layers),
        num_blocks + 1 + extra,
        bs,
        mc.num_kv_heads,
        mc.head_dim,
        dtype,
        config.device,
    )
    if mc.is_hybrid:  # one recurrent-state slot per lane that can run
        from lanes.cache.state_pool import StatePool
        from lanes.models.recurrent_layout import recurrent_layout

        layout = recurrent_layout(mc, decoder.ops.chunked_delta)
        kv.states = StatePool(
            config.max_lanes, len(mc.linear_layers), layout.conv, layout.state, config.device,
            deferred_widths=layout.deferred_widths,
        )  # fmt: skip
    max_ctx = min(mc.max_position_embeddings, num_blocks * bs)
    tables = BlockTables(bs, -(-max_ctx // bs), config.device, num_slots=config.max_lanes)
    graphs = mixed = None
    if (
        config.cuda_graphs
        and config.device.startswith("cuda")
        and decoder.ops.name == "triton"
        and decoder.comm is None
        and not (mc.is_hybrid and decoder.ops.chunked_delta)  # no lanes form of it yet
    ):
        from lanes.graphs import DecodeGraphs
        from lanes.mixed_graphs import MixedGraphs

        graphs = DecodeGraphs(
            decoder, kv, tables, scratch_slot=num_blocks * bs, max_ctx=max_ctx, branches=branches
        )
        if mixed_graphs and MixedGraphs.serves(graphs):
            mixed = MixedGraphs(graphs)
    return ModelRunner(decoder, kv, config.device, tables, graphs, branches, mixed)
