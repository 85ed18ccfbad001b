"""The model drafter: a smaller model with the target's tokenizer and its own paged KV."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch

from lanes.backends import make_ops
from lanes.cache.block_pool import BlockPool
from lanes.cache.block_table import BlockTable
from lanes.cache.kv_pool import KVPool
from lanes.chain_graphs import ChainGraphs
from lanes.config import ConfigError, EngineConfig
from lanes.device_sampling import DeviceChain, greedy_rows
from lanes.drafter.base import Draft, Proposer, ShadowRows, collect_drafts, run_chained
from lanes.lane_rows import rows_of
from lanes.lane_view import Chunk, LaneView
from lanes.models import Checkpoint, build_decoder
from lanes.runner import build_runner
from lanes.sampling import sample_row
from lanes.tokenizer import Tokenizer


def check_same_tokenizer(drafter: Tokenizer, target: Tokenizer) -> None:
    """Drafts are token ids, so both models must mean the same thing by every id."""
    if drafter.vocab_size != target.vocab_size:
        raise ConfigError(
            f"drafter vocabulary ({drafter.vocab_size}) differs from the target's ({target.vocab_size})"
        )
    if drafter.tk.get_vocab(with_added_tokens=True) != target.tk.get_vocab(with_added_tokens=True):
        raise ConfigError("drafter and target tokenizers map tokens to different ids")
    if drafter.eos_token_ids != target.eos_token_ids or drafter.bos_token != target.bos_token:
        raise ConfigError("drafter and target tokenizers have different special tokens")


def with_shared_tensors(drafter: Checkpoint, target: Checkpoint) -> Checkpoint:
    """A `lanes distill` drafter stores only its own tensors; the ones its drafter.json names
    (the tied embedding) come from the target, which must have them in the same shape."""
    import dataclasses
    import json
    from pathlib import Path

    meta = Path(drafter.source) / "drafter.json"
    if not meta.is_file():
        return drafter
    shared = json.loads(meta.read_text()).get("shared_with_target", [])
    shapes = dict(drafter.shapes)
    for name in shared:
        want = target.shapes.get(name)
        if want is None:
            raise ConfigError(f"the drafter takes {name} from the target, which has no such tensor")
        shapes[name] = want

    def load(name: str):
        return target.load(name) if name in shared else drafter.load(name)

    return dataclasses.replace(drafter, shapes=shapes, load=load)


class _Shadow:
    """The drafter's view of a lane: the same tokens, its own blocks and progress."""

    def __init__(self, lane: LaneView, block_size: int) -> None:
        self.lane = lane
        self.block_table = BlockTable(block_size)
        self.num_computed = 0

    @property
    def slot(self) -> int:  # the drafter's runner keeps its blocks in the lane's slot
        return self.lane.slot

    @property
    def num_known(self) -> int:
        return self.lane.num_known

    def token_ids(self, start: int, end: int) -> list[int]:
        return self.lane.token_ids(start, end)


class ModelDrafter(Proposer):
    name = "model"

    def __init__(self, checkpoint: Checkpoint, target_tokenizer: Tokenizer, config: EngineConfig):
        check_same_tokenizer(checkpoint.tokenizer, target_tokenizer)
        if checkpoint.config.is_hybrid:
            raise ConfigError(
                f"drafter {checkpoint.source} is a hybrid (DeltaNet) model; lanes drafts with "
                "attention-only models, n-gram lookup, or a `lanes distill` head"
            )
        self.config = config
        self.source = checkpoint.source
        dtype = getattr(torch, config.torch_dtype_name)
        decoder = build_decoder(
            checkpoint, make_ops(config.exact, config.device, config.kernels), dtype, config.device
        )
        mc, bs = checkpoint.config, config.block_size
        per_block = KVPool.bytes_per_block(mc.num_layers, bs, mc.num_kv_heads, mc.head_dim, dtype)
        num_blocks = max(1, config.draft_kv_cache_bytes // per_block)
        self.pool = BlockPool(num_blocks)
        self.runner = build_runner(decoder, num_blocks, config, dtype)
        self.ops = decoder.ops
        self.shadows: dict[int, _Shadow] = {}
        # a greedy round's forwards as one graph replay (CUDA graphs only)
        graphs = self.runner.graphs
        self.chain = None if graphs is None else ChainGraphs(graphs, self._greedy)

    @staticmethod
    def _greedy(logits: torch.Tensor) -> torch.Tensor:
        return greedy_rows(logits, use_triton=True)[0]

    def _shadow(self, lane: LaneView) -> _Shadow:
        shadow = self.shadows.get(lane.request_id)
        if shadow is None:
            shadow = self.shadows[lane.request_id] = _Shadow(lane, self.config.block_size)
        return shadow

    def _reserve(self, shadow: _Shadow, end: int) -> bool:
        """Blocks for positions < end; when the drafter's pool is full, give the lane up (it
        catches up again later) rather than take memory from the target."""
        need = shadow.block_table.blocks_needed(end)
        if need > self.pool.num_free:
            self.release(shadow.lane)
            return False
        shadow.block_table.append(self.pool.allocate(need))
        return True

    def prefill(self, chunks: Sequence[Chunk]) -> None:
        """Catch up with the target's prompt chunks: compute [drafter progress, chunk end)."""
        todo = []
        for c in chunks:
            shadow = self._shadow(c.lane)
            if shadow.num_computed < c.end and self._reserve(shadow, c.end):
                todo.append((shadow, rows_of(shadow, shadow.num_computed, c.end)))
        if todo:
            self.runner.execute([r for _, r in todo])
            for shadow, r in todo:
                shadow.num_computed = r.end

    def propose(
        self, lanes: Sequence[LaneView], num_drafts: Sequence[int], num_branches=None
    ) -> list[Draft]:
        drafts: dict[int, list[int]] = {lane.request_id: [] for lane in lanes}
        logprobs: dict[int, list[torch.Tensor]] = {lane.request_id: [] for lane in lanes}
        wanted: dict[int, int] = {}  # request id -> drafts to make
        for lane, k in zip(lanes, num_drafts, strict=True):
            shadow = self._shadow(lane)
            # KV for the known tokens and drafts 1..k-1: positions < num_known + k - 1
            if k > 0 and self._reserve(shadow, lane.num_known + k - 1):
                wanted[lane.request_id] = k

        # First forward: catch up to the known tokens and draft one; then one token per forward.
        def catch_up(sh: _Shadow) -> ShadowRows:
            n = self.runner.catch_up_logits(sh.num_known - sh.num_computed)
            return sh, rows_of(sh, sh.num_computed, sh.num_known, num_logits=n)

        steps = [catch_up(sh) for rid, sh in self.shadows.items() if rid in wanted]
        # Greedy lanes draft on the device: each forward reads the previous one's tokens there,
        # and the host reads all k tokens once (not once per draft step).
        chain = DeviceChain(self.ops.name == "triton")
        on_device = all(lane.params.is_greedy for lane in lanes)
        ids = [lane.request_id for lane in lanes]
        # the whole round as one graph replay where it fits (lanes.chain_graphs)
        if on_device and run_chained(self.chain, steps, wanted, 0, chain):
            for sh, r in steps:  # positions [num_computed, num_known + drafts - 1) computed
                sh.num_computed = r.end - 1 + wanted[sh.lane.request_id]
            return collect_drafts(ids, drafts, logprobs, chain)
        previous = None
        for j in range(max(wanted.values(), default=0)):
            if not steps:
                break
            logits = self.runner.execute([r for _, r in steps], previous_tokens=previous)
            last_rows = list(itertools.accumulate(r.num_logits for _, r in steps))
            if on_device:
                previous = chain.greedy(logits, last_rows, [sh.lane.request_id for sh, _ in steps])
            next_steps = []
            for i, ((shadow, step), end) in enumerate(zip(steps, last_rows, strict=True)):
                lane = shadow.lane
                shadow.num_computed = step.end
                position = lane.num_known + j
                if on_device:
                    follow = {"pending_row": i}
                else:
                    token, lp = sample_row(logits[end - 1], lane.params, position, lane.params.seed)
                    drafts[lane.request_id].append(token)
                    logprobs[lane.request_id].append(lp)
                    follow = {"draft_ids": (token,)}
                if j + 1 < wanted[lane.request_id]:
                    step = rows_of(shadow, position, position + 1, num_logits=1, **follow)
                    next_steps.append((shadow, step))
            steps = next_steps
            # drafts 2..k as one graph replay, where the catch-up did not fit one
            if on_device and j == 0 and run_chained(self.chain, steps, wanted, 1, chain, previous):
                for sh, r in steps:  # the chain computed positions [start, start + drafts - 1)
                    sh.num_computed = r.start + wanted[sh.lane.request_id] - 1
                break
        return collect_drafts(ids, drafts, logprobs, chain if on_device else None)

    def accepted(self, lane: LaneView) -> None:
        shadow = self.shadows.get(lane.request_id)
        if shadow is None:
            return
        # KV past the target's settled positions belongs to rejected drafts.
        shadow.num_computed = min(shadow.num_computed, lane.num_computed)
        self.pool.release(shadow.block_table.truncate(lane.num_known))

    def release(self, lane: LaneView) -> None:
        shadow = self.shadows.pop(lane.request_id, None)
        if shadow is not None:
            self.pool.release(shadow.block_table.clear())

    def check_integrity(self) -> None:
        self.pool.check_integrity()
        owned = sum(len(sh.block_table.blocks) for sh in self.shadows.values())
        if owned != self.pool.num_used:
            raise AssertionError(f"drafter: {self.pool.num_used} blocks used, shadows own {owned}")
