"""CUDA graphs for decode and verify forwards: the whole target forward, replayed as one graph.

A graph is captured per (lanes, tokens per lane) bucket: lanes padded up to 1, 2, 4, 8, 16, 32
or 64, each lane carrying T = 1 + drafts tokens (T <= 16). Inputs live in static buffers that
each replay refills. Padding lanes write their K/V to a scratch slot outside the block pool and
their rows are dropped; batch invariance makes padding invisible to the real lanes, so a graphed
round gives the same bits as an eager one.

Static attention layout (kernels.attention.AttentionMeta), lane i of a bucket:

    rows   [i*T, (i+1)*T)          one query tile per lane
    slots  kv_slots[i*C : i*C + ctx_len[i]]     C = the longest context a lane can have

Hybrid models: lane i's recurrent state is slot state_slots[i] of the state pool (padding lanes:
its scratch slot), read and written in place by one delta-rule launch per layer (batch.LaneStates).
Decode buckets (T = 1) advance the slots; verify buckets (T > 1) leave them and keep their rows'
inputs for the host's settle, which runs the accepted rows again once acceptance is known.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence

import torch

from lanes.batch import ForwardBatch, LaneStates, fill_pending
from lanes.block_tables import BlockTables
from lanes.branch_scratch import BranchScratch
from lanes.cache.state_pool import StatePool
from lanes.kernels.attention import AttentionMeta, block_q_for
from lanes.lane_rows import LaneRows
from lanes.models.decoder import Decoder

LANE_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
MAX_TOKENS_PER_LANE = 16


def static_batch(
    group: int,
    input_ids,
    positions,
    slot_mapping,
    first_pos,
    ctx_len,
    kv_slots,
    features=None,
    last_rows_only: bool = False,
    lane_states: LaneStates | None = None,
) -> ForwardBatch:
    """A ForwardBatch over static buffers: lanes of equal row counts, lane i's context slots at
    kv_slots[i * max_ctx:] (the layout above); every row yields logits, or only each lane's
    last. The shapes say the layout: lanes = len(first_pos), rows per lane, max_ctx =
    len(kv_slots) / lanes."""
    lanes = first_pos.shape[0]
    tokens, max_ctx = input_ids.shape[0] // lanes, kv_slots.shape[0] // lanes
    device = input_ids.device
    i64 = dict(dtype=torch.int64, device=device)
    i32 = dict(dtype=torch.int32, device=device)
    meta = AttentionMeta(
        tile_seq=torch.arange(lanes, **i32),
        tile_q0=torch.zeros(lanes, **i32),
        q_start=torch.arange(lanes, **i32) * tokens,
        num_q=torch.full((lanes,), tokens, **i32),
        first_pos=first_pos,
        ctx_len=ctx_len,
        kv_off=torch.arange(lanes, **i64) * max_ctx,
        kv_slots=kv_slots,
        block_q=block_q_for(group),
        max_ctx=max_ctx,
    )
    return ForwardBatch(
        input_ids=input_ids,
        positions=positions,
        slot_mapping=slot_mapping,
        seqs=(),
        logits_indices=(
            torch.arange(1, lanes + 1, **i64) * tokens - 1
            if last_rows_only
            else torch.arange(lanes * tokens, **i64)
        ),
        attn_meta={group: meta},
        features=features,
        lane_states=lane_states,
    )


def valid_slots(row: tuple[list[int], int] | None, blocks: list[int], block_size: int) -> int:
    """How many leading kv_slots entries of a lane row are already right for a lane with these
    blocks, given what the row holds: (the blocks it was written from, positions written). An
    entry is a pure function of the block at its position, so whichever lane the row held before,
    entries in the blocks it shares with this one stay right (a truncation after rejected
    drafts, a preemption or another lane changes the blocks)."""
    if row is None:
        return 0
    old, written = row
    if list(blocks[: len(old)]) == old:
        return written
    pairs = enumerate(zip(old, blocks, strict=False))
    same = next((j for j, (a, b) in pairs if a != b), min(len(old), len(blocks)))
    return min(written, same * block_size)


log = logging.getLogger("lanes")


def log_first_use(kind: str, key: tuple, start: float) -> None:
    """A graph captured inside a round rather than at start stalls every lane of that round:
    say so (INFO), with its key and what it took."""
    log.info(
        "%s %s captured at first use in %.0f ms", kind, key, (time.perf_counter() - start) * 1e3
    )


class _Graph:
    def __init__(
        self,
        lanes: int,
        tokens: int,
        max_ctx: int,
        group: int,
        device,
        feature_row=None,
        states: StatePool | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        n = lanes * tokens
        i64 = dict(dtype=torch.int64, device=device)
        i32 = dict(dtype=torch.int32, device=device)
        self.lanes, self.tokens, self.max_ctx = lanes, tokens, max_ctx
        self.input_ids = torch.zeros(n, **i64)
        self.positions = torch.zeros(n, **i64)
        self.slot_mapping = torch.zeros(n, **i64)
        self.first_pos = torch.zeros(lanes, **i32)
        self.ctx_len = torch.ones(lanes, **i32)
        self.kv_slots = torch.zeros(lanes * max_ctx, **i64)
        # EAGLE-style drafters read a target feature per row: a static buffer like the ids
        self.features = (
            None
            if feature_row is None
            else feature_row.new_zeros((n, feature_row.shape[1]), device=device)
        )
        self.lane_states = None if states is None else _lane_states(states, lanes, tokens, dtype)
        self.batch = static_batch(
            group,
            self.input_ids,
            self.positions,
            self.slot_mapping,
            self.first_pos,
            self.ctx_len,
            self.kv_slots,
            self.features,
            lane_states=self.lane_states,
        )
        self.graph: torch.cuda.CUDAGraph | None = None
        self.forward = None  # DecodeGraphs(eager=True): the forward each "replay" runs instead
        self.logits: torch.Tensor | None = None
        self.hidden: torch.Tensor | None = None  # the decoder's final-norm rows, static
        # What kv_slots holds for each lane row: (the blocks it was written from, positions).
        self.rows: list[tuple[list[int], int] | None] = [None] * lanes

    def valid_slots(self, i: int, blocks: list[int], block_size: int) -> int:
        """How many leading kv_slots entries of lane row i are already right (`valid_slots`)."""
        return valid_slots(self.rows[i], blocks, block_size)


def _lane_states(states: StatePool, lanes: int, tokens: int, dtype: torch.dtype) -> LaneStates:
    """A bucket's recurrent-state layout: every lane on the scratch slot until filled; verify
    buckets (tokens > 1) get static buffers for each linear layer's saved inputs (a gated
    DeltaNet's (mixed, b, a) rows, a Mamba-2 mixer's (xbc, dt))."""
    device = states.conv.device
    slots = torch.full((lanes,), states.scratch_slot, dtype=torch.int64, device=device)
    keep = tokens > 1
    saved = ()
    if keep:
        n, widths = lanes * tokens, states.deferred_widths
        saved = tuple(
            tuple(torch.zeros((n, w), dtype=dtype, device=device) for w in widths)
            for _ in range(states.num_layers)
        )
    return LaneStates(slots=slots, rows_per_lane=tokens, keep=keep, saved=saved)


class _SavedRows(Mapping):
    """One lane's rows of a verify bucket's saved inputs, per linear layer, sliced on access
    (64 lanes x 18 layers of slices per replay would be milliseconds of host time)."""

    def __init__(self, saved, start: int, rows: int) -> None:
        self.saved, self.rows = saved, slice(start, start + rows)

    def __getitem__(self, layer: int) -> tuple[torch.Tensor, ...]:
        return tuple(x[self.rows] for x in self.saved[layer])

    def __iter__(self):
        return iter(range(len(self.saved)))

    def __len__(self) -> int:
        return len(self.saved)


class DecodeGraphs:
    max_tokens_per_lane = MAX_TOKENS_PER_LANE

    def __init__(
        self,
        decoder: Decoder,
        kv,
        tables: BlockTables,
        scratch_slot: int,
        max_ctx: int,
        eager: bool = False,
        branches: BranchScratch | None = None,
    ) -> None:
        """With `eager`, each "replay" runs the forward on the same static buffers without a
        graph (the CPU tests of the bucket layouts). branches: where draft branches keep their
        KV (a branch's rows are a lane of the bucket, its kv_slots row the lane's slots before
        the fork and its own after)."""
        self.decoder = decoder
        self.eager = eager
        self.kv = kv
        self.tables = tables  # the runner's: each lane's blocks and slots, by slot
        self.scratch_slot = scratch_slot
        self.max_ctx = max_ctx
        self.branches = branches
        self.group = decoder.cfg.num_heads // decoder.cfg.num_kv_heads
        self.device = decoder.weights.embed.device
        # EAGLE-style drafters: rows read features too (a zero row of their width and dtype)
        self.feature_row = (
            torch.zeros(
                (1, decoder.cfg.hidden_size), dtype=decoder.weights.norm.dtype, device=self.device
            )
            if decoder.weights.reads_features
            else None
        )
        self.states: StatePool | None = kv.states  # hybrids: each lane's recurrent-state slot
        self.pool = None if eager else torch.cuda.graph_pool_handle()
        self.graphs: dict[tuple[int, int], _Graph] = {}
        self.num_replays = 0
        self.last_hidden: torch.Tensor | None = None  # rows of the latest replay (a view)

    def supports(self, steps: Sequence[LaneRows]) -> bool:
        """Decode/verify rows only (every row yields logits), one token count for all lanes."""
        if not steps or len(steps) > LANE_BUCKETS[-1]:
            return False
        tokens = steps[0].num_tokens
        return tokens <= MAX_TOKENS_PER_LANE and all(
            s.num_tokens == tokens
            and s.num_logits == tokens
            and s.end <= self.max_ctx
            and (not s.branch or self.branches is not None)
            and (s.features is not None) == (self.feature_row is not None)
            and (self.states is None or s.keep_states == (tokens > 1))
            for s in steps
        )

    def prepare(self, tokens_per_lane: Sequence[int]) -> int:
        """Capture every lane bucket's graph for these tokens per lane now, rather than in the
        first round that needs one, where the capture (and Triton's first compiles) would stall
        every running lane. Returns how many graphs were captured."""
        captured = 0
        for tokens in tokens_per_lane:
            if not 0 < tokens <= MAX_TOKENS_PER_LANE:
                continue
            for lanes in LANE_BUCKETS:
                if (lanes, tokens) not in self.graphs:
                    self.graphs[(lanes, tokens)] = self._capture(lanes, tokens)
                    captured += 1
        return captured

    def run(
        self, steps: Sequence[LaneRows], previous_tokens: torch.Tensor | None = None
    ) -> torch.Tensor:
        tokens = steps[0].num_tokens
        lanes = next(b for b in LANE_BUCKETS if b >= len(steps))
        g = self.graphs.get((lanes, tokens))
        if g is None:
            start = time.perf_counter()
            g = self.graphs[(lanes, tokens)] = self._capture(lanes, tokens)
            log_first_use("forward graph (lanes, tokens)", (lanes, tokens), start)
        self._fill(g, steps)
        fill_pending(g.input_ids, range(0, len(steps) * tokens, tokens), steps, previous_tokens)
        replay(g)
        self.num_replays += 1
        if self.states is not None:
            self._states_after(g, steps)
        self.last_hidden = g.hidden[: len(steps) * tokens]
        return g.logits[: len(steps) * tokens].clone()

    def _fill(self, g: _Graph, steps: Sequence[LaneRows]) -> None:
        """Refill the static inputs. kv_slots changes only where a lane's context grew (or its
        blocks changed) since this graph last ran it: a decode step writes one slot per lane,
        not its whole context (64 lanes x 2K context were 5.5 ms of Python per replay)."""
        t, c = g.tokens, g.max_ctx
        ids, pos, slots, first, ctx, state_slots = [], [], [], [], [], []
        where, what = [], []  # kv_slots entries to set
        for i in range(g.lanes):
            if i < len(steps):
                s = steps[i]
                table = self.tables.row(s.slot)
                valid = g.valid_slots(i, s.blocks, table.block_size)
                ids += s.token_ids
                pos += list(range(s.start, s.end))
                first.append(s.start)
                ctx.append(s.end)
                if self.states is not None:
                    self.states.check_position(s.state_slot, s.start)
                    state_slots.append(s.state_slot)
                if s.branch:  # the lane's slots before the fork, the branch's own from it
                    own = self.branches.slots(s.slot, s.branch, range(s.end - s.fork))
                    slots += own[s.start - s.fork :]
                    if valid < s.fork:
                        where += range(i * c + valid, i * c + s.fork)
                        what += table.slots(valid, s.fork)
                    where += range(i * c + s.fork, i * c + s.end)
                    what += own
                    g.rows[i] = (list(s.blocks), s.fork)  # entries from the fork are not the lane's
                    continue
                slots += table.slots(s.start, s.end)
                if valid < s.end:
                    where += range(i * c + valid, i * c + s.end)
                    what += table.slots(valid, s.end)
                g.rows[i] = (list(s.blocks), max(valid, s.end))
            else:  # padding lane: positions 0..T-1, every K/V in the scratch slot
                ids += [0] * t
                pos += list(range(t))
                slots += [self.scratch_slot] * t
                first.append(0)
                ctx.append(t)
                if self.states is not None:
                    state_slots.append(self.states.scratch_slot)
                where += range(i * c, i * c + t)
                what += [self.scratch_slot] * t
                g.rows[i] = None
        # One host-to-device copy of everything, split on the device; never a blocking copy
        # (it would wait for the forward in flight when rounds overlap).
        n, lanes, w, h = len(ids), g.lanes, len(where), len(state_slots)
        staged = torch.tensor(
            ids + pos + slots + first + ctx + state_slots + where + what, dtype=torch.int64
        )
        staged = staged.to(g.input_ids.device, non_blocking=True)
        g.input_ids.copy_(staged[:n])
        g.positions.copy_(staged[n : 2 * n])
        g.slot_mapping.copy_(staged[2 * n : 3 * n])
        g.first_pos.copy_(staged[3 * n : 3 * n + lanes])
        g.ctx_len.copy_(staged[3 * n + lanes : 3 * n + 2 * lanes])
        if h:
            g.lane_states.slots.copy_(staged[3 * n + 2 * lanes : 3 * n + 2 * lanes + h])
        if w:
            kv = staged[3 * n + 2 * lanes + h :]
            g.kv_slots.index_copy_(0, kv[:w], kv[w:])
        if g.features is not None:  # padding rows keep whatever they held: their rows are dropped
            rows = len(steps) * t
            g.features[:rows].copy_(torch.cat([s.features for s in steps]), non_blocking=True)

    def _states_after(self, g: _Graph, steps: Sequence[LaneRows]) -> None:
        """The state pool's host bookkeeping after a replay: decode lanes advanced in place;
        verify lanes still where they were, their rows' inputs kept for settling (read before
        this graph's next replay: verify rounds are taken before the next forward)."""
        t, saved = g.tokens, g.lane_states.saved
        for i, s in enumerate(steps):
            if g.lane_states.keep:
                self.states.defer_all(s.state_slot, s.start, _SavedRows(saved, i * t, t))
            else:
                self.states.advanced(s.state_slot, s.end)

    def _capture(self, lanes: int, tokens: int) -> _Graph:
        g = _Graph(
            lanes,
            tokens,
            self.max_ctx,
            self.group,
            self.device,
            self.feature_row,
            self.states,
            self.decoder.weights.embed.dtype,
        )
        g.slot_mapping.fill_(self.scratch_slot)
        g.kv_slots.fill_(self.scratch_slot)
        g.ctx_len.fill_(tokens)
        g.positions.copy_(torch.arange(tokens, device=self.device).repeat(lanes))

        record(g, self.decoder, self.kv, self.pool, self.eager)
        return g


def record(g, decoder: Decoder, kv, pool, eager: bool) -> None:
    """A bucket's forward over its static batch `g.batch`: captured as a CUDA graph (g.graph,
    with the static logits and final-norm rows each replay refreshes), or with `eager` kept in
    g.forward to run at each replay (the CPU tests of the bucket layouts)."""

    def forward():
        return decoder.forward(g.batch, kv), decoder.last_hidden

    if eager:
        g.forward = forward
    else:
        g.graph, (g.logits, g.hidden) = capture(pool, forward)


def replay(g) -> None:
    """Run a bucket recorded by `record`: its graph, or its forward where it has none."""
    if g.graph is None:
        g.logits, g.hidden = g.forward()
    else:
        g.graph.replay()


def capture(pool, body):
    """(a CUDA graph of body(), what body returned: static tensors each replay refreshes). body
    runs once first on a side stream, so Triton compiles and the allocator settles outside
    the capture."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        body()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        result = body()
    return graph, result
