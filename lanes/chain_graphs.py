"""A drafter's one-token steps, chained on the device and replayed as one CUDA graph.

After its catch-up forward a drafter makes drafts 2..k one forward each: every forward reads the
token the one before it sampled (and, for an EAGLE-style head, the final-norm row it left, its
guess of the target's next feature). Replayed as separate graphs, each of those forwards costs
the host a refill, a launch and the sampling launches while the GPU waits (trace_spec_round:
~0.7 ms of host per ~0.1 ms forward of a one-layer head). Here the S forwards, their greedy
sampling and the hand-over of tokens and features are one graph: the host fills the layout of
all S steps in one copy and launches once.

Layout, lane i of a (lanes, S) chain, steps j = 0..S-1 (one row per lane and step):

    step j:  position r_i + j, KV written to the slot of that position
             context slots kv_slots[i*C : i*C + r_i + j + 1]    (shared by all steps)
             input token: step 0 from the caller (pending rows), step j > 0 step j-1's sample

A lane that wants c_i < S steps repeats its last real position for steps >= c_i with its KV
written to the scratch slot; those samples are dropped. Batch invariance keeps the real rows'
bits those of separate forwards.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch

from lanes.batch import ForwardBatch, fill_pending
from lanes.graphs import LANE_BUCKETS, DecodeGraphs, capture, static_batch, valid_slots
from lanes.rounds import Step

MAX_CHAIN_STEPS = 15


class _Chain:
    def __init__(self, lanes: int, num_steps: int, max_ctx: int, device, fuse=None) -> None:
        i64 = dict(dtype=torch.int64, device=device)
        self.lanes, self.num_steps, self.max_ctx = lanes, num_steps, max_ctx
        self.input_ids = torch.zeros(lanes, **i64)  # step 0's tokens
        # EAGLE-style heads: step 0's features [lanes, hidden]; later steps read the one before's
        self.features = (
            None if fuse is None else fuse.new_zeros((lanes, fuse.shape[1] // 2), device=device)
        )
        self.positions_slots = torch.zeros((2, num_steps, lanes), **i64)
        self.first_ctx = torch.ones((2, num_steps, lanes), dtype=torch.int32, device=device)
        self.kv_slots = torch.zeros(lanes * max_ctx, **i64)
        self.rows: list[tuple[list[int], int] | None] = [None] * lanes  # as _Graph.rows
        self.graph: torch.cuda.CUDAGraph | None = None
        self.tokens: torch.Tensor | None = None  # [num_steps, lanes] static samples
        self.batches: list[ForwardBatch] = []  # one per step, over the buffers above

    def layout(self, steps: Sequence[Step], counts: Sequence[int], scratch: int) -> list[int]:
        """The host side of a refill: step 0's ids [lanes], then positions, slots, first
        positions and context lengths [4, S, lanes], then the kv_slots entries to set (indices,
        then values). Padding lanes sit at positions 0..S-1 with every K/V in the scratch slot."""
        s_, c = self.num_steps, self.max_ctx
        ids = [0] * self.lanes
        positions = [[j] * self.lanes for j in range(s_)]
        slots = [[scratch] * self.lanes for _ in range(s_)]
        where, what = [], []
        for i in range(self.lanes):
            if i >= len(steps):
                where += range(i * c, i * c + s_)
                what += [scratch] * s_
                self.rows[i] = None
                continue
            step, count = steps[i], counts[i]
            table, r = step.lane.block_table, step.start
            ids[i] = step.token_ids()[0]
            own = table.slots(r, r + count)
            for j in range(s_):
                positions[j][i] = r + min(j, count - 1)
                if j < count:
                    slots[j][i] = own[j]
            valid = valid_slots(self.rows[i], table.blocks, table.block_size)
            if valid < r + count:
                where += range(i * c + valid, i * c + r + count)
                what += table.slots(valid, r + count)
            used = -(-(r + count) // table.block_size)
            self.rows[i] = (table.blocks[:used], max(valid, r + count))
        ctx = [[p + 1 for p in row] for row in positions]
        grid = [v for rows in (positions, slots, positions, ctx) for row in rows for v in row]
        return ids + grid + where + what


class ChainGraphs:
    """Chained one-token drafter steps (the module docstring), captured per (lanes bucket, S).
    `sample` maps a forward's logits [lanes, vocab] to its greedy tokens [lanes] on the device;
    it is captured into the graph, so it must launch only device work."""

    def __init__(
        self, graphs: DecodeGraphs, sample: Callable[[torch.Tensor], torch.Tensor]
    ) -> None:
        self.graphs = graphs
        self.sample = sample
        self.chains: dict[tuple[int, int], _Chain] = {}
        self.num_replays = 0

    def supports(self, steps: Sequence[Step], counts: Sequence[int]) -> bool:
        """One-row steps of lanes that each want 1..MAX_CHAIN_STEPS steps within the context."""
        g = self.graphs
        return (
            0 < len(steps) <= LANE_BUCKETS[-1]
            and len(counts) == len(steps)
            and all(
                s.num_tokens == 1
                and 1 <= c <= MAX_CHAIN_STEPS
                and s.start + c <= g.max_ctx
                and (s.features is not None) == (g.fuse is not None)
                for s, c in zip(steps, counts, strict=True)
            )
        )

    def run(
        self,
        steps: Sequence[Step],
        counts: Sequence[int],
        previous_tokens: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Samples [max(counts), len(steps)] on the device: row j holds each lane's token of
        step j (meaningful where j < counts[i]). Steps with a `pending_row` read their first
        token from previous_tokens, as in ModelRunner.execute."""
        lanes = next(b for b in LANE_BUCKETS if b >= len(steps))
        num_steps = max(counts)
        chain = self.chains.get((lanes, num_steps))
        if chain is None:
            chain = self.chains[(lanes, num_steps)] = self._capture(lanes, num_steps)
        self._fill(chain, steps, counts, previous_tokens)
        chain.graph.replay()
        self.num_replays += 1
        return chain.tokens[:, : len(steps)].clone()

    def _fill(self, chain: _Chain, steps, counts, previous_tokens) -> None:
        n, grid = chain.lanes, chain.positions_slots.numel()
        values = chain.layout(steps, counts, self.graphs.scratch_slot)
        staged = torch.tensor(values, dtype=torch.int64).to(
            chain.input_ids.device, non_blocking=True
        )
        chain.input_ids.copy_(staged[:n])
        chain.positions_slots.view(-1).copy_(staged[n : n + grid])
        chain.first_ctx.view(-1).copy_(staged[n + grid : n + 2 * grid])
        rest = staged[n + 2 * grid :]
        if len(rest):
            w = len(rest) // 2
            chain.kv_slots.index_copy_(0, rest[:w], rest[w:])
        fill_pending(chain.input_ids, range(len(steps)), steps, previous_tokens)
        if chain.features is not None:  # padding rows keep whatever they held: dropped
            feats = torch.cat([s.features for s in steps])
            chain.features[: len(steps)].copy_(feats, non_blocking=True)

    def _capture(self, lanes: int, num_steps: int) -> _Chain:
        g = self.graphs
        chain = _Chain(lanes, num_steps, g.max_ctx, g.device, g.fuse)
        chain.positions_slots[0] = torch.arange(num_steps, device=g.device)[:, None]
        chain.positions_slots[1] = g.scratch_slot
        chain.first_ctx[0] = chain.positions_slots[0].to(torch.int32)
        chain.first_ctx[1] = chain.first_ctx[0] + 1
        chain.kv_slots.fill_(g.scratch_slot)

        # kept on the chain: the graph reads their metadata tensors at every replay
        chain.batches = [
            static_batch(
                g.group,
                chain.input_ids,
                chain.positions_slots[0, j],
                chain.positions_slots[1, j],
                chain.first_ctx[0, j],
                chain.first_ctx[1, j],
                chain.kv_slots,
                chain.features,
            )
            for j in range(num_steps)
        ]

        def body() -> torch.Tensor:
            out = []
            for j, batch in enumerate(chain.batches):
                if j:  # the previous step's samples and final-norm rows, on the device
                    hidden = g.decoder.last_hidden if batch.features is not None else None
                    batch = dataclasses.replace(batch, input_ids=out[-1], features=hidden)
                out.append(self.sample(g.decoder.forward(batch, g.kv)))
            return torch.stack(out)

        chain.graph, chain.tokens = capture(g.pool, body)
        return chain
