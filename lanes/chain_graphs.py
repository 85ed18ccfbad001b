"""A drafter's forwards of one round, chained on the device and replayed as one CUDA graph.

A drafter's round is a catch-up forward (the rows its lane gained since the last round; the last
row's sample is draft 1) and then one forward per further draft, each reading the token the one
before it sampled (and, for an EAGLE-style head, the final-norm row it left: its guess of the
target's next feature). Replayed as separate graphs, each forward costs the host a refill, a
launch and the sampling launches while the GPU waits (trace_spec_round: ~0.7 ms of host per
~0.1 ms forward of a one-layer head). Here the S forwards, their greedy sampling and the
hand-over of tokens and features are one graph: the host fills the layout of all S forwards in
one copy and launches once.

Layout, lane i of a (lanes, T, S) chain; its first step covers positions [start_i, end_i) with
T = end_i - start_i rows, last_i = end_i - 1, and it wants c_i samples:

    forward 0:       rows i*T .. i*T+T-1 at positions start_i .. last_i; sample from the last
    forward j >= 1:  one row at position last_i + j, reading forward j-1's sample (and row)
    context slots:   kv_slots[i*C : i*C + last_i + j + 1]    C = max_ctx, shared by all forwards

A lane with c_i < S repeats its last real position for forwards >= c_i, with its KV written to
the scratch slot; those samples are dropped. Batch invariance keeps the real rows' bits those
of separate forwards.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

import torch

from lanes.batch import ForwardBatch, fill_pending
from lanes.graphs import (
    LANE_BUCKETS,
    MAX_TOKENS_PER_LANE,
    DecodeGraphs,
    capture,
    log_first_use,
    static_batch,
    valid_slots,
)
from lanes.lane_rows import LaneRows

MAX_CHAIN_SAMPLES = 16


class LaneSlots:
    """kv_slots of one lane bucket, shared by every chain of that bucket: an entry is a pure
    function of the block at its position, so what one chain wrote stays right for the next."""

    def __init__(self, lanes: int, max_ctx: int, scratch: int, device) -> None:
        self.max_ctx = max_ctx
        self.kv_slots = torch.full((lanes * max_ctx,), scratch, dtype=torch.int64, device=device)
        self.rows: list[tuple[list[int], int] | None] = [None] * lanes  # as _Graph.rows

    def refill(self, i: int, table, end: int) -> tuple[list[int], list[int]]:
        """Lane row i for a lane with this block table, context [0, end): the (indices,
        values) of kv_slots entries to set."""
        valid = valid_slots(self.rows[i], table.blocks, table.block_size)
        used = -(-end // table.block_size)
        self.rows[i] = (table.blocks[:used], max(valid, end))
        if valid >= end:
            return [], []
        base = i * self.max_ctx
        return list(range(base + valid, base + end)), table.slots(valid, end)

    def padding(self, i: int, n: int, scratch: int) -> tuple[list[int], list[int]]:
        """Lane row i as a padding lane's, positions [0, n) in the scratch slot: the entries to
        set (none if it already is one)."""
        if self.rows[i] is None:
            return [], []
        self.rows[i] = None
        base = i * self.max_ctx
        return list(range(base, base + n)), [scratch] * n


class _Chain:
    def __init__(
        self, lanes: int, tokens: int, num_steps: int, slots: LaneSlots, feature_row
    ) -> None:
        device = slots.kv_slots.device
        n = lanes * tokens
        self.lanes, self.tokens, self.num_steps, self.slots = lanes, tokens, num_steps, slots
        # forward 0: ids, positions, KV slots [3, lanes * T]; forwards 1..S-1: positions and
        # KV slots [2, S - 1, lanes]; every forward's first positions and context lengths
        self.first = torch.zeros((3, n), dtype=torch.int64, device=device)
        self.later = torch.zeros((2, num_steps - 1, lanes), dtype=torch.int64, device=device)
        self.first_ctx = torch.ones((2, num_steps, lanes), dtype=torch.int32, device=device)
        # EAGLE-style heads: forward 0's features [lanes * T, hidden]; later ones read the last
        # forward's output rows
        self.features = (
            None if feature_row is None else feature_row.new_zeros((n, feature_row.shape[1]))
        )
        self.graph: torch.cuda.CUDAGraph | None = None
        self.samples: torch.Tensor | None = None  # [num_steps, lanes] static
        self.batches: list[ForwardBatch] = []  # one per forward, over the buffers above

    def layout(
        self, steps: Sequence[LaneRows], counts: Sequence[int], scratch: int, tables
    ) -> list[int]:
        """The host side of a refill, flat: `first` [3, lanes * T], `later` [2, S - 1, lanes],
        `first_ctx` [2, S, lanes], then the kv_slots entries to set (indices, then values).
        Padding lanes are lanes at positions 0..T-1 wanting one sample, all K/V in scratch."""
        t, s_ = self.tokens, self.num_steps
        ids, pos0, slot0 = [], [], []
        later = [[[0] * self.lanes for _ in range(s_ - 1)] for _ in range(2)]
        meta = [[[0] * self.lanes for _ in range(s_)] for _ in range(2)]
        where, what = [], []
        for i in range(self.lanes):
            if i < len(steps):
                step, count = steps[i], counts[i]
                table, start, last = tables.row(step.slot), step.start, step.end - 1
                ids += step.token_ids
                own = table.slots(start, last + count)
                w, v = self.slots.refill(i, table, last + count)
                where += w
                what += v
            else:
                start, last, count, own = 0, t - 1, 1, [scratch] * t
                self.slots.rows[i] = None
                ids += [0] * t
                where += range(i * self.slots.max_ctx, i * self.slots.max_ctx + t)
                what += [scratch] * t
            pos0 += range(start, last + 1)
            slot0 += own[:t]
            meta[0][0][i], meta[1][0][i] = start, last + 1
            for j in range(1, s_):
                p = last + min(j, count - 1)
                later[0][j - 1][i] = p
                later[1][j - 1][i] = own[t - 1 + j] if j < count else scratch
                meta[0][j][i], meta[1][j][i] = p, p + 1
        grids = [v for grid in (later, meta) for rows in grid for row in rows for v in row]
        return ids + pos0 + slot0 + grids + where + what


class ChainGraphs:
    """A drafter's chained forwards (the module docstring), captured per (lanes bucket, T, S).
    `sample` maps a forward's logits [lanes, vocab] to its greedy tokens [lanes] on the device;
    it is captured into the graph, so it must launch only device work."""

    def __init__(
        self, graphs: DecodeGraphs, sample: Callable[[torch.Tensor], torch.Tensor]
    ) -> None:
        self.graphs = graphs
        self.sample = sample
        self.chains: dict[tuple[int, int, int], _Chain] = {}
        self.lane_slots: dict[int, LaneSlots] = {}
        self.num_replays = 0

    def supports(self, steps: Sequence[LaneRows], counts: Sequence[int]) -> bool:
        """Steps of one row count (<= MAX_TOKENS_PER_LANE) whose lanes each want 1..
        MAX_CHAIN_SAMPLES samples within the context."""
        g = self.graphs
        if not 0 < len(steps) <= LANE_BUCKETS[-1] or len(counts) != len(steps):
            return False
        tokens = steps[0].num_tokens
        return tokens <= MAX_TOKENS_PER_LANE and all(
            s.num_tokens == tokens
            and 1 <= c <= MAX_CHAIN_SAMPLES
            and s.end - 1 + c <= g.max_ctx
            and (s.features is not None) == (g.feature_row is not None)
            for s, c in zip(steps, counts, strict=True)
        )

    def run(
        self,
        steps: Sequence[LaneRows],
        counts: Sequence[int],
        previous_tokens: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Samples [max(counts), len(steps)] on the device: row j holds each lane's sample of
        forward j (meaningful where j < counts[i]). Steps with a `pending_row` read their first
        token from previous_tokens, as in ModelRunner.execute."""
        lanes = next(b for b in LANE_BUCKETS if b >= len(steps))
        key = (lanes, steps[0].num_tokens, max(counts))
        chain = self.chains.get(key)
        if chain is None:
            start = time.perf_counter()
            chain = self.chains[key] = self._capture(*key)
            log_first_use("drafter chain (lanes, rows, samples)", key, start)
        for r in steps:
            self.graphs.tables.sync(r.slot, r.blocks)
        self._fill(chain, steps, counts, previous_tokens)
        chain.graph.replay()
        self.num_replays += 1
        return chain.samples[:, : len(steps)].clone()

    def _fill(self, chain: _Chain, steps, counts, previous_tokens) -> None:
        values = chain.layout(steps, counts, self.graphs.scratch_slot, self.graphs.tables)
        staged = torch.tensor(values, dtype=torch.int64)
        staged = staged.to(chain.first.device, non_blocking=True)
        at = 0
        for buffer in (chain.first, chain.later, chain.first_ctx):
            buffer.view(-1).copy_(staged[at : at + buffer.numel()])
            at += buffer.numel()
        if at < len(staged):
            w = (len(staged) - at) // 2
            chain.slots.kv_slots.index_copy_(0, staged[at : at + w], staged[at + w :])
        t = chain.tokens
        fill_pending(chain.first[0], range(0, len(steps) * t, t), steps, previous_tokens)
        if chain.features is not None:  # padding rows keep whatever they held: dropped
            feats = torch.cat([s.features for s in steps])
            chain.features[: len(feats)].copy_(feats, non_blocking=True)

    def _capture(self, lanes: int, tokens: int, num_steps: int) -> _Chain:
        g = self.graphs
        slots = self.lane_slots.get(lanes)
        if slots is None:
            slots = self.lane_slots[lanes] = LaneSlots(lanes, g.max_ctx, g.scratch_slot, g.device)
        chain = _Chain(lanes, tokens, num_steps, slots, g.feature_row)
        # until the first refill: padding lanes (positions 0..T-1, K/V to the scratch slot)
        chain.first[1] = torch.arange(tokens, device=g.device).repeat(lanes)
        chain.first[2] = g.scratch_slot
        chain.later[0] = tokens - 1
        chain.later[1] = g.scratch_slot
        chain.first_ctx[0, 1:] = tokens - 1
        chain.first_ctx[1] = tokens
        first_pos, ctx_len = chain.first_ctx
        chain.batches = [
            static_batch(
                g.group,
                chain.first[0],
                chain.first[1],
                chain.first[2],
                first_pos[0],
                ctx_len[0],
                slots.kv_slots,
                chain.features,
                last_rows_only=True,
            )
        ]
        for j in range(1, num_steps):
            later_ids = chain.first[0, :lanes]  # replaced by forward j-1's samples at capture
            chain.batches.append(
                static_batch(
                    g.group,
                    later_ids,
                    chain.later[0, j - 1],
                    chain.later[1, j - 1],
                    first_pos[j],
                    ctx_len[j],
                    slots.kv_slots,
                    None if chain.features is None else chain.features[:lanes],
                )
            )

        def body() -> torch.Tensor:
            out = []
            for j, batch in enumerate(chain.batches):
                if j:  # the previous forward's samples and the final-norm rows they came from
                    rows = g.decoder.last_hidden
                    hidden = rows.view(lanes, -1, rows.shape[-1])[:, -1]
                    batch = dataclasses.replace(
                        batch,
                        input_ids=out[-1],
                        features=hidden if batch.features is not None else None,
                    )
                out.append(self.sample(g.decoder.forward(batch, g.kv)))
            return torch.stack(out)

        chain.graph, chain.samples = capture(g.pool, body)
        return chain
