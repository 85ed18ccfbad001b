"""The EAGLE-style drafter: one decoder layer that reads the target's own features.

Row r of the drafter reads the token at position r + 1 and the target's final-norm feature at
position r (what the target's LM head read to predict that token), mixed by `fuse`; its own
final-norm output is its guess of the target's feature at r + 1, so the target's LM head (the
shared embedding, or the rows of `vocab` when the drafter predicts a subset) turns it into a
draft for position r + 2. Drafting k tokens feeds each guess back in as the next row's feature.

    target rows:   t0 t1 t2 t3        features f0 f1 f2 f3 (f3 -> t4, sampled)
    drafter rows:  (t1,f0) (t2,f1) (t3,f2) (t4,f3) -> d5   (d5,g4) -> d6 ...

Only rows whose feature came from the target are kept (`num_computed`); rows fed with the
drafter's own guesses are rewritten by the next catch-up. Positions whose features the drafter
never saw read zeros: a weaker draft, never a wrong output, since coupled verification keeps
only what the target itself samples.

Prompt-cache hits: a target block served from the prompt cache has no features this time, so
the drafter keeps a cache of its own blocks, keyed by the target's block key chained with the
one token after the block (a drafter row reads the next token): a lane whose prompt hits the
target's cache finds the drafter's blocks for the same prefix. Only blocks computed entirely
from real features are published.

Features: the target's final-norm output, or (drafter.json "target_feature_layers") the normed
outputs of several target layers side by side, which `eagle.reduce` maps to the drafter's width
as they arrive (`observe`); the drafter's own guesses are already of its width.

A drafter directory (`lanes distill`): config.json (a one-layer Llama config of the target's
width), model.safetensors (layer 0, model.norm, eagle.fuse, optional eagle.vocab and
eagle.reduce) and drafter.json {"kind": "eagle", "target_feature_layers": [...] or null,
"shared_with_target": ["model.embed_tokens.weight"], ...}.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors import safe_open

from lanes.backends import make_ops
from lanes.cache.block_pool import BlockPool
from lanes.cache.block_table import BlockTable
from lanes.cache.kv_pool import KVPool
from lanes.cache.prompt_cache import PromptCache
from lanes.chain_graphs import ChainGraphs
from lanes.config import ConfigError, EngineConfig, ModelConfig
from lanes.device_sampling import DeviceChain, greedy_rows
from lanes.drafter.base import Draft, Proposer, collect_drafts, run_chained
from lanes.drafter.eagle3_format import is_eagle3_dir, load_eagle3
from lanes.drafter.eagle_branches import propose_branches
from lanes.drafter.eagle_parts import EagleParts
from lanes.kernels.sampling import sample_with
from lanes.lane_rows import rows_of
from lanes.lane_view import Chunk, LaneView
from lanes.models import Checkpoint, Decoder, WeightError, assemble, check_shapes
from lanes.packed import PackedWeight
from lanes.runner import build_runner
from lanes.sampling import sample_row

FUSE = "eagle.fuse.weight"  # [hidden, 2 * hidden]
VOCAB = "eagle.vocab"  # [draft vocab] int64: the target token ids the drafter can propose
# [hidden, n * hidden]: maps the target's n feature layers (drafter.json
# "target_feature_layers") to the drafter's width; absent when it reads the final layer alone
REDUCE = "eagle.reduce.weight"


def is_eagle_dir(spec: str) -> bool:
    """A `lanes distill` head, or a published EAGLE-3 head (drafter/eagle3_format.py)."""
    meta = Path(spec) / "drafter.json"
    if meta.is_file():
        return json.loads(meta.read_text()).get("kind") == "eagle"
    return is_eagle3_dir(Path(spec))


def load_eagle_decoder(path: Path, target: Checkpoint, config: EngineConfig) -> EagleParts:
    """The drafter's decoder, vocab, and how it reads the target's features."""
    cfg = ModelConfig.from_hf(json.loads((path / "config.json").read_text()))
    tcfg = target.config
    if not tcfg.tie_word_embeddings:
        raise ConfigError(
            f"drafter {path} uses the target's embedding as its LM head; this target's LM head "
            "is untied"
        )
    if (cfg.hidden_size, cfg.vocab_size) != (tcfg.hidden_size, tcfg.vocab_size):
        raise ConfigError(
            f"drafter {path} was made for a target of hidden size {cfg.hidden_size} and "
            f"vocabulary {cfg.vocab_size}; this target has {tcfg.hidden_size} and {tcfg.vocab_size}"
        )
    own: dict[str, torch.Tensor] = {}
    try:
        with safe_open(str(path / "model.safetensors"), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                own[name] = f.get_tensor(name)
    except (OSError, RuntimeError) as e:
        raise WeightError(f"cannot read {path / 'model.safetensors'}: {e}") from e
    fuse, vocab, reduce = own.pop(FUSE, None), own.pop(VOCAB, None), own.pop(REDUCE, None)
    h = cfg.hidden_size
    if fuse is None or tuple(fuse.shape) != (h, 2 * h):
        raise WeightError(f"{path}: {FUSE} missing or not [hidden, 2 * hidden]")
    layers = json.loads((path / "drafter.json").read_text()).get("target_feature_layers")
    if layers is not None:
        layers = tuple(int(i) for i in layers)
        if not layers or not all(0 <= i < tcfg.num_layers for i in layers):
            raise ConfigError(
                f"drafter {path} reads target layers {list(layers)}; this target has "
                f"{tcfg.num_layers}"
            )
        if reduce is None or tuple(reduce.shape) != (h, len(layers) * h):
            raise WeightError(f"{path}: {REDUCE} missing or not [hidden, {len(layers)} * hidden]")
    elif reduce is not None:
        raise WeightError(f"{path}: {REDUCE} given but drafter.json names no target_feature_layers")
    embed_name = "model.embed_tokens.weight"
    shapes = {k: tuple(v.shape) for k, v in own.items()} | {embed_name: target.shapes[embed_name]}
    check_shapes(shapes, cfg)

    def load(name: str) -> torch.Tensor:
        return target.load(name) if name == embed_name else own[name]

    def packed(name: str) -> PackedWeight | None:  # the target's embedding as the target holds it
        return target.packed(name) if name == embed_name and target.packed else None

    dtype = getattr(torch, config.torch_dtype_name)
    weights = assemble(cfg, load, dtype, config.device, packed=packed)
    weights.fuse = fuse.to(device=config.device, dtype=dtype)
    if vocab is not None:
        vocab = vocab.to(device=config.device, dtype=torch.int64)
        if vocab.ndim != 1 or int(vocab.min()) < 0 or int(vocab.max()) >= cfg.vocab_size:
            raise WeightError(f"{path}: {VOCAB} must list token ids below {cfg.vocab_size}")
        embed = weights.embed
        # a packed embedding's rows stay codes: the head streams a quarter of the bytes
        weights.lm_head = (
            embed.select(vocab) if isinstance(embed, PackedWeight) else embed[vocab].contiguous()
        )
    ops = make_ops(config.exact, config.device, config.kernels)
    if reduce is not None:
        reduce = reduce.to(device=config.device, dtype=dtype)
    return EagleParts(Decoder(cfg, weights, ops), vocab, layers, reduce)


_JOIN_EVERY = 64  # rows arrived in this many forwards are joined into one tensor


class _Shadow:
    """The drafter's view of a lane: row r holds the token at r + 1, so the drafter knows one row
    fewer than the lane has tokens. `features` are the target's, for the rows from
    `num_computed` on, at the head's width.

    The target's rows arrive after every forward (`add`) but are mapped to the head's width
    (`reduce`) only when read, all pending rows in one call: most rounds of a lane that drafts
    little never read them, and the row-independent linear gives each row the same bits however
    many rows it is computed with."""

    def __init__(self, lane: LaneView, block_size: int, reduce) -> None:
        self.lane = lane
        self.block_table = BlockTable(block_size)
        self.num_computed = 0
        self._features: torch.Tensor | None = None  # [rows from num_computed, hidden]
        self._arrived: list[torch.Tensor] = []  # the target's rows after those, not yet reduced
        self._num_arrived = 0
        self._reduce = reduce
        self.zero_blocks: set[int] = set()  # blocks with rows computed from zero features
        self.num_published = 0  # leading blocks offered to the drafter's cache

    @property
    def features(self) -> torch.Tensor | None:
        if self._arrived:
            rows = self._reduce(
                torch.cat(self._arrived) if len(self._arrived) > 1 else self._arrived[0]
            )
            old = self._features
            self._features = rows if old is None or not len(old) else torch.cat([old, rows])
            self._arrived, self._num_arrived = [], 0
        return self._features

    @features.setter
    def features(self, rows: torch.Tensor | None) -> None:
        self._features, self._arrived, self._num_arrived = rows, [], 0

    @property
    def num_pending(self) -> int:
        """Rows from num_computed whose target features the drafter holds."""
        return (0 if self._features is None else self._features.shape[0]) + self._num_arrived

    def observe(self, start: int, rows: torch.Tensor, dtype: torch.dtype) -> None:
        """The target's features of rows from `start`: a view of the forward's rows, which the
        caller copied once for all its lanes (a copy per lane cost a launch per lane per round).
        Rows already held are dropped, rows never seen before `start` held as zeros. Views are
        joined every `_JOIN_EVERY` rounds, so that a lane that seldom drafts does not keep many
        forwards' rows alive.

        Runs for every drafting lane every round, drafts or not: one call, and no tensor op
        where none is needed (at 16 lanes on an H100, a slice, a same-dtype `to` and `len`s
        per lane cost ~0.1 ms a round where the model's round takes ~1 ms)."""
        f = self._features
        have = self.num_computed + (0 if f is None else f.shape[0]) + self._num_arrived
        if start > have:  # positions the drafter never saw: zeros (reduced: zeros still)
            self.mark_zero(have, start)
            rows = torch.cat([rows.new_zeros((start - have, rows.shape[1])), rows])
            start = have
        if have > start:
            rows = rows[have - start :]
        n = rows.shape[0]
        if not n:
            return
        self._arrived.append(rows if rows.dtype == dtype else rows.to(dtype))
        self._num_arrived += n
        if len(self._arrived) >= _JOIN_EVERY:
            self._arrived = [torch.cat(self._arrived)]

    @property
    def slot(self) -> int:  # the drafter's runner keeps its blocks in the lane's slot
        return self.lane.slot

    @property
    def num_known(self) -> int:
        return self.lane.num_known - 1

    def token_ids(self, start: int, end: int) -> list[int]:
        return self.lane.token_ids(start + 1, end + 1)

    def features_until(self, end: int, like: torch.Tensor) -> torch.Tensor:
        """Features of rows [num_computed, end); zeros where the target's were never seen."""
        have = self.features if self.features is not None else like.new_zeros((0, like.shape[-1]))
        need = end - self.num_computed
        if len(have) >= need:
            return have[:need]
        self.mark_zero(self.num_computed + len(have), end)
        return torch.cat([have, like.new_zeros((need - len(have), like.shape[-1]))])

    def mark_zero(self, start: int, end: int) -> None:
        bs = self.block_table.block_size
        self.zero_blocks.update(range(start // bs, (end - 1) // bs + 1))

    def advance(self, end: int) -> None:
        """Rows < end are computed from the target's features."""
        if self.features is not None:
            self.features = self.features[end - self.num_computed :]
        self.num_computed = end


class EagleDrafter(Proposer):
    name = "eagle"
    uses_target_hidden = True

    def __init__(self, path: str, target: Checkpoint, config: EngineConfig) -> None:
        self.config = config
        self.source = path
        load = load_eagle3 if is_eagle3_dir(Path(path)) else load_eagle_decoder
        parts = load(Path(path), target, config)
        decoder, self.vocab, self.reduce = parts.decoder, parts.vocab, parts.reduce
        self.target_feature_layers = parts.feature_layers
        self.target_features_prenorm = parts.prenorm_features
        self.ops = decoder.ops
        mc, bs = decoder.cfg, config.block_size
        dtype = decoder.weights.embed.dtype
        per_block = KVPool.bytes_per_block(mc.num_layers, bs, mc.num_kv_heads, mc.head_dim, dtype)
        num_blocks = max(1, config.draft_kv_cache_bytes // per_block)
        self.pool = BlockPool(num_blocks)
        self.cache = PromptCache(self.pool, "eagle", max_blocks=num_blocks // 2)
        self.runner = build_runner(decoder, num_blocks, config, dtype)
        self.vocab_size = mc.vocab_size
        self.shadows: dict[int, _Shadow] = {}
        self._zero = torch.zeros((1, mc.hidden_size), dtype=dtype, device=config.device)
        # a greedy round's forwards as one graph replay (CUDA graphs only)
        graphs = self.runner.graphs
        self.chain = None if graphs is None else ChainGraphs(graphs, self._greedy)

    def _shadow(self, lane: LaneView) -> _Shadow:
        shadow = self.shadows.get(lane.request_id)
        if shadow is None:
            shadow = _Shadow(lane, self.config.block_size, self._to_head_width)
            self.shadows[lane.request_id] = shadow
            # the drafter's own cached blocks for the prefix the target found cached
            usable = self._reusable(lane, lane.num_computed // self.config.block_size)
            blocks = self.cache.match(self._keys(lane, usable))
            shadow.block_table.append(blocks)
            shadow.num_computed = len(blocks) * self.config.block_size
            shadow.num_published = len(blocks)
        return shadow

    def _reusable(self, lane: LaneView, num_blocks: int) -> int:
        """Of the lane's first num_blocks blocks, how many the drafter may take from its cache:
        it leaves at least its newest known row to compute (propose needs that row's logits)."""
        bs = self.config.block_size
        return max(0, min(num_blocks, len(lane.block_keys), (lane.num_known - 2) // bs))

    def cached_prefix_blocks(self, lane: LaneView, num_blocks: int) -> int:
        return self.cache.num_matching(self._keys(lane, self._reusable(lane, num_blocks)))

    def _keys(self, lane: LaneView, n: int) -> list[bytes]:
        """Keys of the drafter's first n blocks: the target's block key and the next token."""
        bs = self.config.block_size
        next_tokens = lane.token_ids(bs, n * bs + 1)[::bs] if n else []  # positions bs, 2bs, ...
        return [
            hashlib.sha256(key + int(t).to_bytes(8, "little", signed=True)).digest()
            for key, t in zip(lane.block_keys[:n], next_tokens, strict=False)
        ]

    def _publish(self, shadow: _Shadow) -> None:
        """Offer the drafter's complete blocks that read only real features."""
        lane, bs = shadow.lane, self.config.block_size
        complete = min(shadow.num_computed // bs, len(lane.block_keys))
        if complete <= shadow.num_published:
            return
        keys = self._keys(lane, complete)
        for i in range(shadow.num_published, len(keys)):
            if i not in shadow.zero_blocks:
                self.cache.publish(keys[i], shadow.block_table.blocks[i])
        shadow.num_published = len(keys)

    def _reserve(self, shadow: _Shadow, end: int) -> bool:
        """Blocks for rows < end; when the pool is full, give the lane up (it starts over later,
        with zero features for what it missed) rather than take memory from the target."""
        need = shadow.block_table.blocks_needed(end)
        if need > self.cache.num_available:
            self.release(shadow.lane)
            return False
        shadow.block_table.append(self.cache.allocate(need))
        return True

    def _to_head_width(self, hidden: torch.Tensor) -> torch.Tensor:
        """The target's features at the drafter's width and dtype (`reduce` maps several
        layers' features to one)."""
        hidden = hidden.to(self._zero.dtype)
        return hidden if self.reduce is None else self.ops.linear(hidden, self.reduce)

    def observe(self, lane: LaneView, start: int, hidden: torch.Tensor) -> None:
        shadow = self.shadows.get(lane.request_id)
        if shadow is None:
            shadow = self._shadow(lane)
        shadow.observe(start, hidden, self._zero.dtype)

    def prefill(self, chunks: Sequence[Chunk]) -> None:
        """Catch up on prompt chunks in the same round, leaving the newest row to `propose`
        (whose first forward needs its logits)."""
        todo = []
        for c in chunks:
            shadow = self.shadows.get(c.lane.request_id)
            if shadow is None or shadow.features is None:
                continue
            end = min(shadow.num_computed + len(shadow.features), shadow.num_known) - 1
            if end > shadow.num_computed and self._reserve(shadow, end):
                feats = shadow.features_until(end, self._zero)
                todo.append((shadow, rows_of(shadow, shadow.num_computed, end, features=feats)))
        if todo:
            self.runner.execute([r for _, r in todo])
            for shadow, r in todo:
                shadow.advance(r.end)
                self._publish(shadow)

    def _full_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits over the target's vocabulary (-inf outside the drafter's subset)."""
        if self.vocab is None:
            return logits
        full = logits.new_full((logits.shape[0], self.vocab_size), float("-inf"))
        full[:, self.vocab] = logits
        return full

    def propose(
        self,
        lanes: Sequence[LaneView],
        num_drafts: Sequence[int],
        num_branches: Sequence[int] | None = None,
    ) -> list[Draft]:
        if num_branches is not None and max(num_branches, default=1) > 1:
            return propose_branches(self, lanes, num_drafts, num_branches)
        drafts: dict[int, list[int]] = {lane.request_id: [] for lane in lanes}
        logprobs: dict[int, list[torch.Tensor]] = {lane.request_id: [] for lane in lanes}
        wanted: dict[int, int] = {}
        steps = []
        for lane, k in zip(lanes, num_drafts, strict=True):
            shadow = self._shadow(lane)
            # rows up to the newest known token, then k - 1 rows that read drafts
            if k > 0 and self._reserve(shadow, shadow.num_known + k - 1):
                wanted[lane.request_id] = k
                end = shadow.num_known
                feats = shadow.features_until(end, self._zero)
                n = self.runner.catch_up_logits(end - shadow.num_computed)
                rows = rows_of(shadow, shadow.num_computed, end, num_logits=n, features=feats)
                steps.append((shadow, rows))
        # Greedy lanes draft on the device: each step reads the previous one's tokens and
        # feature guesses there, and the host reads all k tokens once (lanes.device_sampling).
        chain = DeviceChain(self.runner.decoder.ops.name == "triton")
        on_device = all(lane.params.is_greedy for lane in lanes)
        ids = [lane.request_id for lane in lanes]
        # the whole round as one graph replay where it fits (lanes.chain_graphs)
        if on_device and run_chained(self.chain, steps, wanted, 0, chain):
            for shadow, r in steps:
                shadow.advance(r.end)
                self._publish(shadow)
            return collect_drafts(ids, drafts, logprobs, chain)
        previous = None
        for j in range(max(wanted.values(), default=0)):
            if not steps:
                break
            rows = [r for _, r in steps]
            logits = self._full_logits(self.runner.execute(rows, previous_tokens=previous))
            hidden = self.runner.last_hidden
            token_ends = list(itertools.accumulate(r.num_tokens for r in rows))
            index = torch.tensor(token_ends, dtype=torch.int64) - 1
            guesses = hidden[index.to(hidden.device, non_blocking=True)]  # next-feature guesses
            logits_rows = list(itertools.accumulate(r.num_logits for r in rows))
            if on_device:
                keys = [shadow.lane.request_id for shadow, _ in steps]
                previous = chain.greedy(logits, logits_rows, keys)
            next_steps = []
            for row, ((shadow, step), logits_end) in enumerate(
                zip(steps, logits_rows, strict=True)
            ):
                lane = shadow.lane
                if j == 0:
                    shadow.advance(step.end)
                    self._publish(shadow)
                position = lane.num_known + j
                if on_device:
                    follow = {"pending_row": row}
                else:
                    token, lp = sample_row(
                        logits[logits_end - 1], lane.params, position, lane.params.seed
                    )
                    drafts[lane.request_id].append(token)
                    logprobs[lane.request_id].append(lp)
                    follow = {"draft_ids": (token,)}
                if j + 1 < wanted[lane.request_id]:
                    r = shadow.num_known + j
                    feature = guesses[row : row + 1]
                    next_rows = rows_of(shadow, r, r + 1, num_logits=1, features=feature, **follow)
                    next_steps.append((shadow, next_rows))
            steps = next_steps
            # drafts 2..k as one graph replay, where the catch-up did not fit one
            if on_device and j == 0 and run_chained(self.chain, steps, wanted, 1, chain, previous):
                break
        return collect_drafts(ids, drafts, logprobs, chain if on_device else None)

    # ---- drafted rounds on the device (lanes/device_rounds.py) -------------------------------

    def device_rounds(self, target, num_drafts: int, eager: bool = False, branches: int = 1):
        """Drafted greedy rounds kept on the device for this head and the target's runner, or
        None where they cannot run: Triton ops on both, one process, an attention-only target;
        CUDA graphs on both (or, with `eager`, the same ops run eagerly: the CPU tests).
        branches > 1: draft trees, the other branches led by the head's next likeliest first
        drafts (lanes/device_round_trees.py)."""
        from lanes.device_rounds import DeviceRounds, Side

        if num_drafts < 1 or target.comm is not None:
            return None
        if target.decoder.cfg.is_hybrid:  # recurrent state would need rolling back on device
            return None
        if self.ops.name != "triton" or target.decoder.ops.name != "triton":
            return None
        graphed = target.graphs is not None and self.runner.graphs is not None
        if not graphed and not eager:
            return None
        bs = self.config.block_size

        def side(runner) -> Side:
            positions = runner.num_blocks * bs
            cap = min(runner.decoder.cfg.max_position_embeddings, positions)
            return Side(runner.decoder, runner.kv, positions, cap, runner.branches)

        def sample(logits: torch.Tensor, positions: torch.Tensor, params) -> torch.Tensor:
            # each lane's own sampling, with the noise of the position the draft will stand at
            return sample_with(self._full_logits(logits).contiguous(), params, positions)[0]

        def alternatives(logits: torch.Tensor, first: torch.Tensor, n: int) -> torch.Tensor:
            # the likeliest tokens after the first draft (for greedy lanes, its ranking; for
            # sampled lanes an approximation: drafts only, the verify keeps the output exact)
            full = self._full_logits(logits).float()
            return full.scatter(1, first[:, None], float("-inf")).topk(n, dim=1).indices

        pool = target.graphs.pool if graphed else None
        if branches > 1 and (target.branches is None or self.runner.branches is None):
            branches = 1
        return DeviceRounds(
            side(target), side(self.runner), self, num_drafts, sample, self._to_head_width, pool,
            branches, alternatives,
        )  # fmt: skip

    def device_seed(self, lane: LaneView, max_rows: int):
        """Where the lane's device rounds can start (lanes.device_rounds.Seed): the rows the
        head has the target's features for but has not computed, 1 .. max_rows of them; None
        where that is not the lane's state."""
        from lanes.device_rounds import Seed

        shadow = self.shadows.get(lane.request_id)
        if shadow is None or shadow.features is None:
            return None
        start, n = shadow.num_computed, shadow.num_known - shadow.num_computed
        if not 1 <= n <= max_rows or len(shadow.features) < n:
            return None
        return Seed(start, lane.token_ids(start + 1, start + 1 + n), shadow.features[:n])

    def device_table(self, lane: LaneView, end: int) -> BlockTable | None:
        """The head's blocks of the lane, holding rows < end; None (nothing taken) where its
        pool cannot."""
        shadow = self.shadows.get(lane.request_id)
        if shadow is None:
            return None
        need = shadow.block_table.blocks_needed(end)
        if need > self.cache.num_available:
            return None
        if need:
            shadow.block_table.append(self.cache.allocate(need))
        return shadow.block_table

    def device_settle(self, lane: LaneView, computed: int) -> None:
        """A device round read back: the head's rows < computed are settled; its pending
        features are on the device until `device_resume`."""
        shadow = self.shadows.get(lane.request_id)
        if shadow is not None:
            shadow.num_computed = computed
            shadow.features = None
            self._publish(shadow)

    def device_resume(self, lane: LaneView, features: torch.Tensor) -> None:
        """The device rounds ended: the head's pending features (rows from num_computed)."""
        shadow = self.shadows.get(lane.request_id)
        if shadow is not None:
            shadow.features = features

    def _greedy(self, logits: torch.Tensor) -> torch.Tensor:
        return greedy_rows(self._full_logits(logits), use_triton=True)[0]

    def accepted(self, lane: LaneView) -> None:
        shadow = self.shadows.get(lane.request_id)
        if shadow is not None:  # rows past the newest known token held drafts
            self.cache.release(shadow.block_table.truncate(shadow.num_known))

    def release(self, lane: LaneView) -> None:
        shadow = self.shadows.pop(lane.request_id, None)
        if shadow is not None:
            self.cache.release(shadow.block_table.clear())

    def check_integrity(self) -> None:
        """Block refcounts: each shadow's, plus one for each block the drafter's cache keeps."""
        self.cache.check_integrity(sh.block_table.blocks for sh in self.shadows.values())
