"""Drafted rounds that stay on the device: an EAGLE-style head's k drafts, the target's verify
forward and the acceptance, as one CUDA graph per round, each round launched on the one before's
results while the host is still reading those. Greedy and seeded lanes alike: every row is
sampled by the position-keyed kernel with its lane's parameters (device buffers set when the
rounds start), the head's drafts with the noise of the positions they will stand at, so coupled
verification keeps them where the target samples the same token.

A synchronous drafted round makes the GPU wait for the host twice: the host reads the verify's
tokens back, appends them, and only then lays out the head's next catch-up (its length is the
accepted count). Here the accepted count never leaves the device on the critical path: every
position of round R + 1 is round R's verify position plus its accepted count plus a constant,
computed inside the graph, and the head's catch-up always has k + 1 rows (the verify's rows),
of which the first a + 1 are real. The host reads each round's tokens one round late and
mirrors them into its lanes (Engine._step_device_rounds).

Round of lane i, from the state the previous round left: v (its verify's first position), a
(drafts it kept), g [k + 1] (its sampled tokens: g[j] is the token after position v + j) and f
[k + 1, hidden] (the head-width features of its rows):

    head catch-up   rows v .. v + k reading (g[j], f[j]); row a's sample is draft 1
    head drafts     forward m = 1 .. k - 1 at position v + a + m, reading draft m and the row
                    the forward before it sampled from
    verify          positions v' = v + a + 1 .. v' + k, tokens [g[a], d1 .. dk]
    acceptance      a' = the leading drafts equal to the verify's sampled tokens; the round
                    emits g'[0 .. a'], and leaves (v', a', g', f') for the next

Rows past a are not real (their drafts were rejected); they write K/V at positions every later
forward rewrites before it reads them (a forward writes a position's K/V before attending to
it), and their samples are never read. Batch invariance makes a row's bits independent of how
many rows ride with it, so the tokens are those of the synchronous path (tests/test_device_rounds).

Draft trees (`branches` > 1, lanes/device_round_trees.py): the head's later forwards and the
verify run every branch as rows of its own, each branch's context slots its lane's before the
fork and its own scratch slots after; the round keeps the branch with the most kept drafts and
moves its K/V into the lane's slots, all inside the same graph.

Slots: each lane row has the context slots of its target and head blocks (LaneSlots); the host
reserves blocks two rounds ahead (a round moves at most k + 1 positions) and writes only the
entries that changed. Padding lanes stay at position 0 with every K/V in the scratch slots.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from lanes.chain_graphs import LaneSlots
from lanes.device_round_trees import BranchLayout
from lanes.device_sampling import upload_params
from lanes.graphs import LANE_BUCKETS, capture, log_first_use, static_batch
from lanes.kernels.sampling import RowParams, sample_with


@dataclass(frozen=True)
class Side:
    """One model's part of a round: its decoder and KV pool, the slot padding lanes write to,
    and the longest context a lane row holds."""

    decoder: object
    kv: object
    scratch_slot: int
    max_ctx: int
    branches: object = None  # lanes.branch_scratch.BranchScratch: where draft branches live

    @property
    def group(self) -> int:
        cfg = self.decoder.cfg
        return cfg.num_heads // cfg.num_kv_heads


@dataclass(frozen=True)
class RoundResult:
    """One lane's round, read back: the verify's sampled tokens and log-probabilities (k + 1 of
    each), how many drafts it kept, and the position of its verify's first row."""

    tokens: list[int]
    logprobs: list[float]
    accepted: int
    verify_start: int
    branch: int = 0  # the draft branch the kept tokens came from (lanes/device_round_trees.py)

    @property
    def emitted(self) -> list[tuple[int, float]]:
        n = self.accepted + 1
        return list(zip(self.tokens[:n], self.logprobs[:n], strict=True))


@dataclass(frozen=True)
class Seed:
    """Where a lane's device rounds start: the head has computed rows < start and holds the
    target's features of rows start .. start + len(tokens) - 1, whose tokens (each row's next
    one) are `tokens`; the last of them is the token the next verify starts from."""

    start: int
    tokens: list[int]
    features: torch.Tensor  # [len(tokens), hidden], head width


class _Bucket:
    """Static buffers, forward batches and the graph of one lane count (a LANE_BUCKETS size).

    Every position, slot, first position and context length of a round is v + a * ca + c for
    its lane's (v, a) and constants (ca, c) fixed by the layout, so a round computes all of
    them in a handful of kernels (`layout`) instead of a few per forward:

        positions  [catch-up: lanes * T | drafts m = 1 .. k-1: lanes each | verify: lanes * T]
        meta       [k + 1, 2, lanes]    first position and context length of each forward

    and the catch-up's logits row of lane i is i * T + a.
    """

    def __init__(
        self,
        lanes: int,
        k: int,
        target: Side,
        head: Side,
        width: int,
        dtype,
        device,
        branches: int = 1,
    ) -> None:
        self.lanes, self.k, self.t, self.w = lanes, k, k + 1, branches
        t = self.t
        i64 = dict(dtype=torch.int64, device=device)
        # the state one round leaves for the next (see the module docstring)
        self.v = torch.zeros(lanes, **i64)
        self.a = torch.zeros(lanes, **i64)
        self.g = torch.zeros((lanes, t), **i64)
        self.f = torch.zeros((lanes * t, width), dtype=dtype, device=device)
        self.live = torch.zeros(lanes, dtype=torch.bool, device=device)
        self.params = RowParams.zeros(lanes, device)  # each lane's sampling (padding: greedy)
        self.params_w = RowParams.zeros(lanes * branches, device)  # the same, per branch row
        self.zero = torch.zeros((), **i64)
        self.target_slots = LaneSlots(lanes, target.max_ctx, target.scratch_slot, device)
        self.head_slots = LaneSlots(lanes, head.max_ctx, head.scratch_slot, device)
        # the layout's constants: lane, ca, c of every value (positions, then meta)
        lane, ca, c = [], [], []

        def add(i: int, with_a: int, const: int) -> None:
            lane.append(i)
            ca.append(with_a)
            c.append(const)

        for i in range(lanes):  # catch-up rows v .. v + k
            for j in range(t):
                add(i, 0, j)
        for m in range(1, k):  # draft forward m at v + a + m
            for i in range(lanes):
                add(i, 1, m)
        for i in range(lanes):  # verify rows v + a + 1 .. v + a + 1 + k
            for j in range(t):
                add(i, 1, 1 + j)
        self.num_positions = len(lane)
        self.num_head_positions = lanes * t + (k - 1) * lanes
        firsts = [(0, 0)] + [(1, m) for m in range(1, k)] + [(1, 1)]  # each forward's (ca, c)
        rows = [t] + [1] * (k - 1) + [t]
        for (with_a, first), n in zip(firsts, rows, strict=True):
            for i in range(lanes):
                add(i, with_a, first)
            for i in range(lanes):
                add(i, with_a, first + n)
        self.lane_of = torch.tensor(lane, **i64)
        self.ca = torch.tensor(ca, **i64)
        self.c = torch.tensor(c, **i64)
        self.values = torch.zeros(len(lane), **i64)
        self.meta = torch.ones((k + 1, 2, lanes), dtype=torch.int32, device=device)
        table_base = [i * head.max_ctx for i in lane[: self.num_head_positions]] + [
            i * target.max_ctx for i in lane[self.num_head_positions : self.num_positions]
        ]
        self.table_base = torch.tensor(table_base, **i64)
        self.slots = torch.zeros(self.num_positions, **i64)
        # the forwards over those buffers; input ids and features are set per forward
        positions, slots = self.values[: self.num_positions], self.slots
        n_c, n_h = lanes * t, self.num_head_positions
        self.row_base = torch.arange(lanes, **i64) * t
        self.rows = torch.zeros(lanes, **i64)  # the catch-up's logits rows: i * T + a
        self.catch_up = dataclasses.replace(
            static_batch(
                head.group,
                self.g.view(-1),
                positions[:n_c],
                slots[:n_c],
                self.meta[0, 0],
                self.meta[0, 1],
                self.head_slots.kv_slots,
                self.f,
            ),
            logits_indices=self.rows,
        )
        self.drafts = [
            static_batch(
                head.group,
                self.v,  # placeholder: the previous forward's samples
                positions[n_c + (m - 1) * lanes : n_c + m * lanes],
                slots[n_c + (m - 1) * lanes : n_c + m * lanes],
                self.meta[m, 0],
                self.meta[m, 1],
                self.head_slots.kv_slots,
                self.f[:lanes],  # placeholder: the previous forward's sampled rows
            )
            for m in range(1, k)
        ]
        self.verify = static_batch(
            target.group,
            positions[n_h:],  # placeholder: [g[a], d1 .. dk]
            positions[n_h:],
            slots[n_h:],
            self.meta[k, 0],
            self.meta[k, 1],
            self.target_slots.kv_slots,
        )
        # read back per lane: tokens [t], logprobs [t], accepted, verify start, branch kept
        self.out = torch.zeros((lanes, 2 * t + 3), dtype=torch.float64, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.tree = None if branches == 1 else self._tree(target, head, device)

    def _tree(self, target: Side, head: Side, device) -> BranchLayout:
        """The tree buffers and the forwards over them: each branch a lane of its own."""
        lanes, k, t, w = self.lanes, self.k, self.t, self.w
        tree = BranchLayout(lanes, w, k, head.max_ctx, target.max_ctx, device)
        n = lanes * w
        ids = torch.zeros(n * t, dtype=torch.int64, device=device)
        tree.drafts = [
            static_batch(
                head.group,
                ids[:n],
                tree.draft_pos[m - 1],
                tree.draft_slots[m - 1],
                tree.draft_meta[m - 1, 0],
                tree.draft_meta[m - 1, 1],
                tree.head_kv,
            )  # fmt: skip  (ids and features: the previous forward's, set per forward)
            for m in range(1, k)
        ]
        tree.verify = static_batch(
            target.group, ids, tree.verify_pos, tree.verify_slots, tree.verify_meta[0],
            tree.verify_meta[1], tree.target_kv,
        )  # fmt: skip
        return tree

    def layout(self) -> None:
        """Every position, slot, logits row, first position and context length of the round,
        from (v, a): nine kernels."""
        n = self.num_positions
        with_v = self.v.index_select(0, self.lane_of).add_(self.c)
        torch.addcmul(with_v, self.a.index_select(0, self.lane_of), self.ca, out=self.values)
        self.meta.view(-1).copy_(self.values[n:])
        torch.add(self.row_base, self.a, out=self.rows)
        index = self.values[:n] + self.table_base
        h = self.num_head_positions
        torch.index_select(self.head_slots.kv_slots, 0, index[:h], out=self.slots[:h])
        torch.index_select(self.target_slots.kv_slots, 0, index[h:], out=self.slots[h:])
        if self.tree is not None:  # the branch rows, from the lane rows
            lanes, k = self.lanes, self.k
            draft = slice(lanes * self.t, h)
            verify = self.values[h:n].view(lanes, self.t)
            self.tree.layout(
                self.head_slots.kv_slots, self.target_slots.kv_slots,
                self.values[draft].view(k - 1, lanes), self.slots[draft].view(k - 1, lanes),
                self.meta[1:k], verify, self.slots[h:].view(lanes, self.t), self.meta[k],
                verify[:, 0],
            )  # fmt: skip


class DeviceRounds:
    """Drafted rounds on the device for up to 64 lanes (module docstring).

    `target` and `head` are the two models' sides; `drafter` is the EAGLE-style drafter, which
    lays out and settles its lanes (`device_seed`, `device_table`, `device_settle`,
    `device_resume`); `sample(logits, positions, params)` is its token for each lane's row over
    the target's vocabulary (positions [lanes]: where each draft will stand; params: the lanes'
    RowParams) and `reduce(features)` maps the target's features to its width. With
    a `graph_pool` (CUDA), a round is one graph replay; without, the same ops run eagerly (the
    CPU tests)."""

    def __init__(
        self,
        target: Side,
        head: Side,
        drafter,
        num_drafts: int,
        sample: Callable[[torch.Tensor, torch.Tensor, RowParams], torch.Tensor],
        reduce: Callable[[torch.Tensor], torch.Tensor],
        graph_pool=None,
        branches: int = 1,
        alternatives: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor] | None = None,
    ) -> None:
        """branches > 1: draft trees (lanes/device_round_trees.py), the head's catch-up logits
        giving `alternatives(logits, first drafts, n)` [lanes, n], the other branches' first
        drafts; both sides need branch scratch (Side.branches)."""
        if num_drafts < 1:
            raise ValueError("device rounds need at least one draft")
        if branches > 1 and (target.branches is None or head.branches is None):
            raise ValueError("draft branches need branch scratch on the target and the head")
        self.branches, self.alternatives = branches, alternatives
        self.target, self.head, self.drafter = target, head, drafter
        self.k = num_drafts
        self.sample, self.reduce = sample, reduce
        self.pool = graph_pool
        weights = head.decoder.weights
        self.width, self.dtype = weights.embed.shape[1], weights.embed.dtype
        self.device = weights.embed.device
        self.buckets: dict[int, _Bucket] = {}
        self.bucket: _Bucket | None = None  # the running lanes' bucket
        self.lanes: list = []  # the lanes of the running rounds, by row
        self.pending: list[tuple[torch.Tensor, object]] = []  # (read-back buffer, event)
        self.last: list[RoundResult] = []  # the last round taken, by lane row
        self.num_rounds = 0

    # ---- what the engine calls --------------------------------------------------------------

    def reach(self, lane) -> int:
        """Positions < reach(lane) may be written by the next round launched while one is in
        flight: the host knows the lane as of two rounds back, and a round moves at most k + 1
        positions. The engine reserves target blocks up to here."""
        return lane.num_known + 2 * self.k + 1

    def prepare(self) -> int:
        """Build (and on CUDA capture) every lane bucket now, not when rounds first start with
        that many lanes. Returns how many were built."""
        built = 0
        for size in LANE_BUCKETS:
            if size not in self.buckets:
                self.buckets[size] = self._bucket(size)
                built += 1
        return built

    def start(self, lanes: Sequence) -> bool:
        """Seed the rounds from the lanes' host state (after a synchronous round); False, with
        nothing changed, where a lane's head state cannot seed them."""
        if not 0 < len(lanes) <= LANE_BUCKETS[-1] or self.pending:
            return False
        seeds = [self.drafter.device_seed(lane, self.k + 1) for lane in lanes]
        if any(s is None for s in seeds):
            return False
        size = next(b for b in LANE_BUCKETS if b >= len(lanes))
        b = self.buckets.get(size)
        if b is None:
            begun = time.perf_counter()
            b = self.buckets[size] = self._bucket(size)
            log_first_use("device-round bucket (lanes,)", (size,), begun)
        t = b.t
        v, a, g, live = [], [], [], []
        feats = []
        for i in range(size):
            if i < len(seeds):
                s = seeds[i]
                n = len(s.tokens)
                v.append(s.start)
                a.append(n - 1)
                g += s.tokens + [0] * (t - n)
                live.append(1)
                feats.append(s.features[:n].to(self.dtype))
                if n < t:
                    feats.append(
                        torch.zeros((t - n, self.width), dtype=self.dtype, device=self.device)
                    )
            else:
                v.append(0)
                a.append(0)
                g += [0] * t
                live.append(0)
                feats.append(torch.zeros((t, self.width), dtype=self.dtype, device=self.device))
        staged = torch.tensor(v + a + g + live, dtype=torch.int64).to(
            self.device, non_blocking=True
        )
        b.v.copy_(staged[:size])
        b.a.copy_(staged[size : 2 * size])
        b.g.view(-1).copy_(staged[2 * size : 2 * size + size * t])
        b.live.copy_(staged[2 * size + size * t :].bool())
        b.f.copy_(torch.cat(feats))
        params = [lane.params for lane in lanes] + [None] * (size - len(lanes))
        b.params.copy_(upload_params(params, self.device))
        if b.tree is not None:
            w = self.branches
            b.params_w.copy_(upload_params([p for p in params for _ in range(w)], self.device))
            for i in range(size):
                if i < len(lanes):
                    slot = lanes[i].slot
                    head = [
                        self.head.branches.slots(slot, j, range(self.k - 1)) for j in range(1, w)
                    ]
                    target = [
                        self.target.branches.slots(slot, j, range(self.k + 1)) for j in range(1, w)
                    ]
                    b.tree.set_scratch(i, head, target)
                else:
                    b.tree.pad(i, self.head.scratch_slot, self.target.scratch_slot)
        self.bucket, self.lanes = b, list(lanes)
        return True

    def launch(self) -> bool:
        """Launch the next round of the running lanes on the device state the last one left.
        False, with nothing launched, where the head cannot hold the reach in its pool."""
        b = self.bucket
        tables = []
        for lane in self.lanes:
            head_table = self.drafter.device_table(lane, self.reach(lane))
            if head_table is None:
                return False
            tables.append((lane.block_table, head_table))
        where_t, what_t, where_h, what_h = [], [], [], []
        for i in range(b.lanes):
            if i < len(tables):
                end = self.reach(self.lanes[i])
                w, x = b.target_slots.refill(i, tables[i][0], end)
                y, z = b.head_slots.refill(i, tables[i][1], end)
            else:  # a padding lane reaches position 2k + 1 at most
                w, x = b.target_slots.padding(i, 2 * b.t, self.target.scratch_slot)
                y, z = b.head_slots.padding(i, 2 * b.t, self.head.scratch_slot)
            where_t += w
            what_t += x
            where_h += y
            what_h += z
        if where_t or where_h:
            staged = torch.tensor(where_t + what_t + where_h + what_h, dtype=torch.int64)
            staged = staged.to(self.device, non_blocking=True)
            n, m = len(where_t), len(where_h)
            if n:
                b.target_slots.kv_slots.index_copy_(0, staged[:n], staged[n : 2 * n])
            if m:
                tail = staged[2 * n :]
                b.head_slots.kv_slots.index_copy_(0, tail[:m], tail[m:])
        if b.graph is None:
            self._round(b)
        else:
            b.graph.replay()
        self.num_rounds += 1
        if b.out.is_cuda:
            host = torch.empty(b.out.shape, dtype=b.out.dtype, pin_memory=True)
            host.copy_(b.out, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record()
        else:
            host, ready = b.out.clone(), None
        self.pending.append((host, ready))
        return True

    def take(self) -> list[RoundResult]:
        """The oldest launched round's results, by lane row (waits for that round alone)."""
        host, ready = self.pending.pop(0)
        if ready is not None:
            ready.synchronize()
        t = self.bucket.t
        rows = host.tolist()
        self.last = [
            RoundResult(
                tokens=[int(x) for x in row[:t]],
                logprobs=row[t : 2 * t],
                accepted=int(row[2 * t]),
                verify_start=int(row[2 * t + 1]),
                branch=int(row[2 * t + 2]),
            )
            for row in rows[: len(self.lanes)]
        ]
        return self.last

    def stop(self, live: set[int]) -> None:
        """End the rounds (nothing may be in flight): the head of each live lane row takes
        back the features of the kept rows of the last round taken (none if none was)."""
        if self.pending:
            raise RuntimeError("stop() with a round in flight")
        b = self.bucket
        for i, (lane, r) in enumerate(zip(self.lanes, self.last, strict=False)):
            if i in live:
                n = r.accepted + 1
                self.drafter.device_resume(lane, b.f[i * b.t : i * b.t + n].clone())
        self.bucket, self.lanes, self.last = None, [], []

    def _bucket(self, size: int) -> _Bucket:
        """A new bucket, captured (on CUDA) before any lane is in it: the capture's warm-up run
        then writes only scratch slots and leaves the state at padding lanes' zeros."""
        b = _Bucket(
            size, self.k, self.target, self.head, self.width, self.dtype, self.device,
            self.branches,
        )  # fmt: skip
        if self.pool is not None:
            b.graph, _ = capture(self.pool, lambda: self._round(b))
        return b

    # ---- the round (captured) ---------------------------------------------------------------

    def _round(self, b: _Bucket) -> None:
        t, h = self.target, self.head
        k, T = b.k, b.t
        b.layout()
        # the head catches up on the last verify's rows; row a's sample is draft 1
        positions = b.values[b.num_head_positions : b.num_positions].view(b.lanes, T)
        # the token a row samples stands one position after the row
        logits = h.decoder.forward(b.catch_up, h.kv)
        drafts = [self.sample(logits, positions[:, 0] + 1, b.params)]
        hidden = h.decoder.last_hidden[b.rows]
        if b.tree is not None:
            self._tree_round(b, logits, drafts[0], hidden, positions)
            return
        for m, batch in enumerate(b.drafts, start=1):
            batch = dataclasses.replace(batch, input_ids=drafts[-1], features=hidden)
            logits = h.decoder.forward(batch, h.kv)
            drafts.append(self.sample(logits, positions[:, m] + 1, b.params))
            hidden = h.decoder.last_hidden
        d = torch.stack(drafts, 1)  # [lanes, k]
        # the target verifies [g[a], d1 .. dk] at v' = v + a + 1
        ids = torch.cat([b.g.gather(1, b.a[:, None]), d], 1).view(-1)
        logits = t.decoder.forward(dataclasses.replace(b.verify, input_ids=ids), t.kv)
        tokens, logprobs = sample_with(logits, b.params, (positions + 1).view(-1), T)
        tokens, logprobs = tokens.view(b.lanes, T), logprobs.view(b.lanes, T)
        accepted = (tokens[:, :k] == d).long().cumprod(1).sum(1)
        features = self.reduce(t.decoder.last_hidden)
        self._finish(b, tokens, logprobs, accepted, features, positions[:, 0], b.zero)

    def _tree_round(self, b: _Bucket, logits, first: torch.Tensor, hidden, positions) -> None:
        """The round's drafts and verify with branches (lanes/device_round_trees.py), from the
        catch-up's logits, their samples `first` [lanes] and features `hidden` [lanes, width]."""
        t, h, tree = self.target, self.head, b.tree
        k, T, w, lanes = b.k, b.t, b.w, b.lanes
        firsts = torch.cat([first[:, None], self.alternatives(logits, first, w - 1)], 1)
        drafts = [firsts.reshape(-1)]  # [lanes * w]: lane-major, branch-minor
        hidden = hidden.repeat_interleave(w, 0)
        rows = positions.repeat_interleave(w, 0)  # each branch row's positions [lanes * w, T]
        for m, batch in enumerate(tree.drafts, start=1):
            batch = dataclasses.replace(batch, input_ids=drafts[-1], features=hidden)
            logits = h.decoder.forward(batch, h.kv)
            drafts.append(self.sample(logits, rows[:, m] + 1, b.params_w))
            hidden = h.decoder.last_hidden
        d = torch.stack(drafts, 1).view(lanes, w, k)
        root = b.g.gather(1, b.a[:, None]).view(lanes, 1, 1).expand(-1, w, 1)
        ids = torch.cat([root, d], 2).reshape(-1)
        logits = t.decoder.forward(dataclasses.replace(tree.verify, input_ids=ids), t.kv)
        tokens, logprobs = sample_with(logits, b.params_w, (rows + 1).view(-1), T)
        tokens, logprobs = tokens.view(lanes, w, T), logprobs.view(lanes, w, T)
        accepted, branch = tree.choose(d, tokens)
        own = b.slots[b.num_head_positions :].view(lanes, T)
        tree.adopt(t.kv, branch, own)
        pick = branch.view(lanes, 1, 1).expand(-1, 1, T)
        tokens, logprobs = tokens.gather(1, pick)[:, 0], logprobs.gather(1, pick)[:, 0]
        features = self.reduce(t.decoder.last_hidden).view(lanes, w, T, -1)
        width = features.shape[-1]
        features = features.gather(1, pick[..., None].expand(-1, -1, -1, width))[:, 0]
        self._finish(b, tokens, logprobs, accepted, features.reshape(lanes * T, width),
                     positions[:, 0], branch)  # fmt: skip

    def _finish(self, b: _Bucket, tokens, logprobs, accepted, features, start, branch) -> None:
        """The round's read-back row and the state it leaves for the next; padding lanes stay
        at position 0."""
        branch = branch.expand(b.lanes) if branch.dim() == 0 else branch
        row = [tokens, logprobs, accepted[:, None], start[:, None], branch[:, None]]
        b.out.copy_(torch.cat([x.to(b.out.dtype) for x in row], 1))
        torch.where(b.live, start, b.zero, out=b.v)
        torch.where(b.live, accepted, b.zero, out=b.a)
        b.g.copy_(tokens)
        b.f.copy_(features)
