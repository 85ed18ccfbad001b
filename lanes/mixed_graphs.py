"""CUDA graphs for mixed forwards: decode rows beside one prompt chunk, replayed as one graph.

A round's first forward carries every decode step and the first prompt chunk (lanes/rounds.py).
Eagerly, that forward's launches all come from the host, so while a prompt arrives among
decoding lanes every one of their tokens waited for an eager forward instead of a graph replay
(issue 42). Here such a forward, when its chunk is short (where launches weigh most beside its
own work), fits a bucket and replays: decode lanes padded up to LANE_BUCKETS, chunk rows up to
CHUNK_BUCKETS.

Layout of bucket (L lanes, C chunk rows); M = the longest context (DecodeGraphs' capacity, at
most MAX_CONTEXT):

    rows      [0, L)              decode lane i's row (padding lanes: id 0 at position 0, K/V to
                                  the scratch slot)
              [L, L + r)          the chunk's r rows
              [L + r, L + C + 1)  padding rows (at least one), K/V to the scratch slot
    seqs      0: the chunk; 1: its padding rows, positions 0.. over their own scratch keys;
              2 + i: decode lane i
    kv_slots  region j = [j * M, (j + 1) * M) holds seq j's context (region 1: scratch only)
    logits    the decode rows in order, then the chunk's last real row

The chunk region's query tiles are assigned to seqs 0 and 1 at each replay (device buffers), so
padding rows walk a few hundred scratch keys, not the chunk's context: deep in a long prompt a
query tile over the real context costs about 0.6 ms a layer at 32K on an H100 whatever its
length (bench.kernels.attention --chunks). Where the chunk's tiles are few their key partitions
are computed by parallel programs (the attention kernel's split form, same bits). One kv_slots
buffer serves every bucket (a bucket's lanes are a prefix of it), refilled only where a lane's
context grew or its blocks changed, as DecodeGraphs does. Batch invariance makes the layout
invisible: every row gets the bits it gets in an eager forward.

Attention-only models without drafter features (hybrids' recurrent state and EAGLE heads keep
their eager mixed forwards); the engine's own target forwards, one process.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from lanes.batch import ForwardBatch, fill_pending
from lanes.graphs import DecodeGraphs, log_first_use, record, replay, valid_slots
from lanes.kernels.attention import AttentionMeta, block_q_for
from lanes.lane_rows import LaneRows

LANE_BUCKETS = (4, 16, 64)
# contexts a mixed graph holds: its key partitions split over programs (a chunk deep in a long
# prompt has few query tiles, each walking every key), and the split's scratch grows with this
MAX_CONTEXT = 32768
# chunks longer than the last bucket run eagerly: there the chunk's own work outweighs launches
CHUNK_BUCKETS = (32, 64, 128, 192, 256, 384, 512)
_KV_TAIL = CHUNK_BUCKETS[-1] + 256


class _MixedGraph:
    """One bucket's static inputs and graph. Seqs: 0 the chunk, 1 its padding rows, 2 + i
    decode lane i. The chunk region's query tiles are assigned to seqs 0 and 1 at each replay."""

    def __init__(self, lanes: int, chunk: int, group: int, kv_slots, max_ctx: int, device):
        n = lanes + chunk + 1  # one row past the chunk's is always padding: seq 1 is never empty
        i64 = dict(dtype=torch.int64, device=device)
        i32 = dict(dtype=torch.int32, device=device)
        self.lanes, self.chunk = lanes, chunk
        self.block_q = bq = block_q_for(group)
        self.region_tiles = -(-(chunk + 1) // bq) + 1  # the chunk's tiles and its padding's
        self.input_ids = torch.zeros(n, **i64)
        self.positions = torch.zeros(n, **i64)
        self.slot_mapping = torch.zeros(n, **i64)
        self.first_pos = torch.zeros(2 + lanes, **i32)
        self.ctx_len = torch.ones(2 + lanes, **i32)
        self.q_start = torch.tensor([lanes, lanes] + list(range(lanes)), **i32)
        self.num_q = torch.ones(2 + lanes, **i32)
        # decode tiles first (fixed): the kernel starts the last tiles first, the chunk's long
        self.tile_seq = torch.tensor(list(range(2, lanes + 2)) + [0] * self.region_tiles, **i32)
        self.tile_q0 = torch.zeros(lanes + self.region_tiles, **i32)
        self.logits_indices = torch.zeros(lanes + 1, **i64)
        meta = AttentionMeta(
            tile_seq=self.tile_seq,
            tile_q0=self.tile_q0,
            q_start=self.q_start,
            num_q=self.num_q,
            first_pos=self.first_pos,
            ctx_len=self.ctx_len,
            kv_off=torch.arange(lanes + 2, **i64) * max_ctx,
            kv_slots=kv_slots,
            block_q=bq,
            max_ctx=max_ctx,
            long_tiles=-(-chunk // bq),  # the decode lanes' keys are few beside the chunk's
        )
        self.batch = ForwardBatch(
            input_ids=self.input_ids,
            positions=self.positions,
            slot_mapping=self.slot_mapping,
            seqs=(),
            logits_indices=self.logits_indices,
            attn_meta={group: meta},
        )
        self.graph: torch.cuda.CUDAGraph | None = None
        self.forward = None  # eager: the forward each "replay" runs instead
        self.logits: torch.Tensor | None = None
        self.hidden: torch.Tensor | None = None

    def region_layout(self, real: int) -> list[list[int]]:
        """For a chunk of `real` rows: its padding's row count, then the chunk region's tiles
        (seq, first query): the chunk's, its padding's, and copies of the padding's first tile
        (they store what it stores) up to the fixed count."""
        bq, pad = self.block_q, self.chunk + 1 - real
        tiles = [(0, q0) for q0 in range(0, real, bq)] + [(1, q0) for q0 in range(0, pad, bq)]
        tiles += [(1, 0)] * (self.region_tiles - len(tiles))
        return [[pad], [t[0] for t in tiles], [t[1] for t in tiles]]


class MixedGraphs:
    def __init__(self, graphs: DecodeGraphs) -> None:
        """Beside the decode graphs, sharing their decoder, memory pool, block tables and
        scratch slot (and their eager mode: the CPU tests of the layout)."""
        self.decoder = graphs.decoder
        self.kv = graphs.kv
        self.tables = graphs.tables
        self.scratch_slot = graphs.scratch_slot
        self.max_ctx = min(graphs.max_ctx, MAX_CONTEXT)
        self.eager = graphs.eager
        self.pool = graphs.pool
        self.group = graphs.group
        self.device = graphs.device
        # regions: the chunk's, its padding's (every entry the scratch slot, never changed),
        # then one per decode lane; a tail past them for key tiles that read beyond a region
        size = (2 + LANE_BUCKETS[-1]) * self.max_ctx + _KV_TAIL
        self.kv_slots = torch.full(
            (size,), self.scratch_slot, dtype=torch.int64, device=self.device
        )
        # what each lane region of kv_slots holds: (the blocks it was written from, positions)
        self.regions: list[tuple[list[int], int] | None] = [None] * (2 + LANE_BUCKETS[-1])
        self.graphs: dict[tuple[int, int], _MixedGraph] = {}
        self.num_replays = 0
        self.last_hidden: torch.Tensor | None = None

    @staticmethod
    def serves(graphs: DecodeGraphs) -> bool:
        """Whether a model's forwards can take mixed graphs: attention only, no features."""
        return graphs.states is None and graphs.feature_row is None and graphs.branches is None

    def bucket(self, rows: Sequence[LaneRows]) -> tuple[int, int] | None:
        """The bucket of a forward of decode rows (one token, one logits row each) followed by
        one prompt chunk (at most the last bucket's rows, logits at most on its last); None if
        the forward is not of that shape."""
        if len(rows) < 2 or len(rows) - 1 > LANE_BUCKETS[-1]:
            return None
        *decode, chunk = rows
        if not (
            chunk.num_tokens <= CHUNK_BUCKETS[-1]
            and chunk.num_logits <= 1
            and _plain(chunk)
            and chunk.pending_row is None
            and chunk.end <= self.max_ctx
        ):
            return None
        if not all(
            d.num_tokens == 1 and d.num_logits == 1 and _plain(d) and d.end <= self.max_ctx
            for d in decode
        ):
            return None
        lanes = next(b for b in LANE_BUCKETS if b >= len(decode))
        return lanes, next(b for b in CHUNK_BUCKETS if b >= chunk.num_tokens)

    def supports(self, rows: Sequence[LaneRows]) -> bool:
        return self.bucket(rows) is not None

    def prepare(self) -> int:
        """Capture every bucket now rather than in the round that first needs one (a capture
        stalls every lane of that round). Returns how many were captured."""
        captured = 0
        for lanes in LANE_BUCKETS:
            for chunk in CHUNK_BUCKETS:
                if (lanes, chunk) not in self.graphs:
                    self.graphs[(lanes, chunk)] = self._capture(lanes, chunk)
                    captured += 1
        return captured

    def run(
        self, rows: Sequence[LaneRows], previous_tokens: torch.Tensor | None = None
    ) -> torch.Tensor:
        key = self.bucket(rows)
        g = self.graphs.get(key)
        if g is None:
            start = time.perf_counter()
            g = self.graphs[key] = self._capture(*key)
            log_first_use("mixed graph (lanes, chunk rows)", key, start)
        self._fill(g, rows)
        n, chunk = len(rows) - 1, rows[-1]
        fill_pending(g.input_ids, [*range(n), g.lanes], rows, previous_tokens)
        replay(g)
        self.num_replays += 1
        hidden = g.hidden
        r = chunk.num_tokens
        # the forward's rows in the order the runner's callers read them: decode, then chunk
        self.last_hidden = (
            hidden[: n + r]
            if n == g.lanes
            else torch.cat([hidden[:n], hidden[g.lanes : g.lanes + r]])
        )
        logits = g.logits
        return (logits[: n + 1] if chunk.num_logits else logits[:n]).clone()

    def _fill(self, g: _MixedGraph, rows: Sequence[LaneRows]) -> None:
        """Refill the bucket's static inputs; kv_slots only where a region is stale."""
        m, scratch = self.max_ctx, self.scratch_slot
        *decode, chunk = rows
        ids, pos, slots, first, ctx = [], [], [], [], []
        where, what = [], []  # kv_slots entries to set
        for i in range(g.lanes):
            region = 2 + i
            if i < len(decode):
                s = decode[i]
                ids += s.token_ids
                pos.append(s.start)
                slots += self.tables.row(s.slot).slots(s.start, s.end)
                first.append(s.start)
                ctx.append(s.end)
                self._refresh(region, s, where, what)
            else:  # padding lane: position 0, its one key in the scratch slot
                ids.append(0)
                pos.append(0)
                slots.append(scratch)
                first.append(0)
                ctx.append(1)
                where.append(region * m)
                what.append(scratch)
                self.regions[region] = None
        real = chunk.num_tokens
        (pad,), tile_seq, tile_q0 = layout = g.region_layout(real)
        ids += list(chunk.token_ids) + [0] * pad
        pos += list(range(chunk.start, chunk.end)) + list(range(pad))
        slots += self.tables.row(chunk.slot).slots(chunk.start, chunk.end) + [scratch] * pad
        self._refresh(0, chunk, where, what)
        logits_rows = [*range(len(decode)), g.lanes + real - 1]
        logits_rows += [0] * (g.lanes + 1 - len(logits_rows))
        seqs = [
            [chunk.start, 0, *first],  # first positions: the padding rows from 0
            [chunk.end, pad, *ctx],  # context lengths: the padding's own rows, all scratch
            [g.lanes, g.lanes + real],  # the chunk's and the padding's first rows
            [real, pad],
        ]
        ints = ids + pos + slots + logits_rows
        for part in (*seqs, *layout[1:], where, what):
            ints += part
        # one host-to-device copy, split on the device; never blocking (a forward may be in flight)
        staged = torch.tensor(ints, dtype=torch.int64).to(g.input_ids.device, non_blocking=True)
        n, at = len(ids), 0
        for dst, count in (
            (g.input_ids, n), (g.positions, n), (g.slot_mapping, n),
            (g.logits_indices, g.lanes + 1), (g.first_pos, g.lanes + 2), (g.ctx_len, g.lanes + 2),
            (g.q_start[:2], 2), (g.num_q[:2], 2),
            (g.tile_seq[g.lanes :], g.region_tiles), (g.tile_q0[g.lanes :], g.region_tiles),
        ):  # fmt: skip
            dst.copy_(staged[at : at + count])
            at += count
        if where:
            w = len(where)
            self.kv_slots.index_copy_(0, staged[at : at + w], staged[at + w : at + 2 * w])

    def _refresh(self, region: int, s: LaneRows, where: list[int], what: list[int]) -> None:
        """The kv_slots entries of `region` that must change for lane rows s, appended."""
        table = self.tables.row(s.slot)
        valid = valid_slots(self.regions[region], s.blocks, table.block_size)
        if valid < s.end:
            where += range(region * self.max_ctx + valid, region * self.max_ctx + s.end)
            what += table.slots(valid, s.end)
        self.regions[region] = (list(s.blocks), max(valid, s.end))

    def _capture(self, lanes: int, chunk: int) -> _MixedGraph:
        g = _MixedGraph(lanes, chunk, self.group, self.kv_slots, self.max_ctx, self.device)
        g.slot_mapping.fill_(self.scratch_slot)
        # the capture's chunk: all C rows, over the first C entries of its region
        (pad,), tile_seq, tile_q0 = g.region_layout(chunk)
        g.tile_seq[lanes:] = torch.tensor(tile_seq)
        g.tile_q0[lanes:] = torch.tensor(tile_q0)
        g.q_start[1], g.num_q[0], g.num_q[1] = lanes + chunk, chunk, pad
        g.ctx_len[0], g.ctx_len[1] = chunk, pad

        record(g, self.decoder, self.kv, self.pool, self.eager)
        return g


def _plain(r: LaneRows) -> bool:
    """Rows a mixed graph takes: no draft branch, drafts or features from elsewhere."""
    return not r.branch and r.draft_source is None and r.features is None
