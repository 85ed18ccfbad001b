"""The scheduler: which lanes run, what the next round computes, and where their blocks go.

Host logic only (no forward runs here), so it is tested with a stand-in runner. Contract:
- `admit` moves waiting lanes into running ones, in order, while a lane slot and blocks for a
  first chunk are free; a lane starts from the longest cached prefix of its known tokens.
- `plan` returns a LaneRound (plain data, lanes/rounds.py) whose blocks are reserved; when the
  pool cannot hold them it preempts the newest lanes first (`preempt`: nothing computed is lost,
  whole blocks go to the prompt cache and the lane is requeued first).
- `publish` offers only blocks below `num_computed`: their forward has completed (a block is
  never published before the KV it names exists). `release` gives everything a lane holds back.
- `check_integrity` checks the books: every block reference is a lane's or the cache's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from lanes.cache.prompt_cache import PromptCache
from lanes.config import EngineConfig
from lanes.drafter import Proposer
from lanes.lane import Lane, LaneState
from lanes.launched_chunks import LaunchedChunks
from lanes.mask_budget import MaskBudget
from lanes.metrics import EngineMetrics
from lanes.prompt_burst import PromptBurst
from lanes.recurrent import RecurrentStates
from lanes.rounds import LaneRound, plan_round
from lanes.share import ShareAllocator


class Scheduler:
    def __init__(
        self,
        config: EngineConfig,
        cache: PromptCache,
        recurrent: RecurrentStates | None,
        share: ShareAllocator,
        mask_budget: MaskBudget,
        chunks: LaunchedChunks,
        proposer: Proposer | None,
        metrics: EngineMetrics,
        context_len: int,
        clock: Callable[[], float],
    ) -> None:
        self.config = config
        self.cache = cache
        self.recurrent = recurrent
        self.share = share
        self.mask_budget = mask_budget
        self.chunks = chunks
        self.proposer = proposer
        self.metrics = metrics
        self.clock = clock
        self.burst = PromptBurst(config.prefill_bursts)
        # the last length a lane can reach: within the context and the KV pool
        self.len_cap = min(context_len, cache.pool.num_blocks * config.block_size)
        self.waiting: list[Lane] = []
        self.running: list[Lane] = []
        self._free_slots = list(range(config.max_lanes - 1, -1, -1))  # rows of the block tables
        # whether the drafter would leave a prompt to a later catch-up at this many lanes
        # (lanes/drafting.py `skips_prompts`, set by the engine): then a drafted lane takes
        # the target's whole prompt-cache hit (`_drafter_reach`)
        self.drafter_skips_prompts: Callable[[int], bool] = lambda num_lanes: False

    def max_len(self, lane: Lane) -> int:
        """Last length the lane can reach: prompt + max_tokens, within context and KV pool."""
        return min(len(lane.prompt_ids) + lane.params.max_tokens, self.len_cap)

    # ---- admission ------------------------------------------------------------------------

    def admit(self) -> list[tuple[Lane, Exception]]:
        """Admit waiting lanes; the lanes that failed to join, with what failed (still queued:
        the caller ends them)."""
        failed = []
        bs = self.config.block_size
        for lane in list(self.waiting):
            if len(self.running) >= self.config.max_lanes:
                break
            try:
                matched = self.match_prefix(lane)
            except Exception as e:
                failed.append((lane, e))
                continue
            first_end = min(lane.num_known, len(matched) * bs + self.config.prefill_chunk)
            if self.running and -(-first_end // bs) - len(matched) > self.cache.num_available:
                self.cache.release(matched)
                break
            self._join(lane, matched)
        return failed

    def _join(self, lane: Lane, matched: list[int]) -> None:
        bs = self.config.block_size
        lane.block_table.append(matched)
        if self.recurrent is not None:
            self.recurrent.admit(lane, len(matched))
        lane.num_computed = len(matched) * bs
        lane.num_published = len(matched)
        if lane.first_scheduled_time is None:  # not a return from preemption
            lane.first_scheduled_time = self.clock()
            lane.cached_tokens = lane.num_computed
            self.metrics.cached_tokens += lane.num_computed
            self.metrics.queried_tokens += len(lane.prompt_ids)
        lane.state = LaneState.FILL
        lane.slot = self._free_slots.pop()
        self.waiting.remove(lane)
        self.running.append(lane)

    def match_prefix(self, lane: Lane) -> list[int]:
        """The cached blocks of the lane's longest cached prefix (referenced for the lane)."""
        bs = self.config.block_size
        tokens = lane.all_ids()
        lane.block_keys = self.cache.chain_keys(tokens, bs, lane.cache_salt, lane.block_keys)
        usable = min(len(lane.block_keys), (len(tokens) - 1) // bs)  # recompute >= 1 token
        matched = self.cache.match(lane.block_keys[: self._drafter_reach(lane, usable)])
        if self.recurrent is not None:  # hybrids resume only as far as a state snapshot reaches
            keep = self.recurrent.resumable(lane.block_keys[: len(matched)])
            self.cache.release(matched[keep:])
            matched = matched[:keep]
        return matched

    def _drafter_reach(self, lane: Lane, usable: int) -> int:
        """How many of its `usable` leading blocks a lane may take from the prompt cache: all,
        unless it drafts with a drafter that reads the target's features. Blocks served from
        the cache have none, and a head reading zeros for a whole prompt drafts worse (CPU, the
        shipped head, everyday questions first sent with `draft: false`: 1.48 tokens per verify
        against 1.74 fresh). So such a lane takes what the drafter's own cache holds for the
        prefix and has the target recompute at most one prefill chunk beyond it: a long cached
        document keeps most of its hit. Not where the drafter would not read the prompt now
        (drafting predicted to lose at the lanes it will run among): on an H100 at 16 lanes
        that recompute took 80 ms of a 0.77 s drafted run that drafted nothing."""
        p, cfg = self.proposer, self.config
        drafts = p is not None and lane.params.draft and cfg.num_draft_tokens > 0
        if not (drafts and p.uses_target_hidden):
            return usable
        if self.drafter_skips_prompts(min(cfg.max_lanes, len(self.running) + len(self.waiting))):
            return usable
        held = p.cached_prefix_blocks(lane, usable)
        return min(usable, max(held, usable - cfg.prefill_chunk // cfg.block_size))

    def cached_prefix_len(self, ids: list[int], cache_salt: str) -> int:
        """Tokens of this prefix the prompt cache holds now (whole blocks)."""
        bs = self.config.block_size
        keys = self.cache.chain_keys(ids, bs, cache_salt, [])
        matching = self.cache.num_matching(keys)
        if self.recurrent is not None:
            matching = self.recurrent.resumable(keys[:matching])
        return matching * bs

    # ---- planning -------------------------------------------------------------------------

    def plan(self, num_drafts: Callable[[Lane, int], int]) -> LaneRound:
        """Plan a round whose blocks fit; preempt the newest lanes until they do.
        num_drafts(lane, number of decode lanes) gives each decode lane its draft slots."""
        cfg = self.config
        while True:
            num_decode = sum(lane.state is LaneState.DECODE for lane in self.running)
            filling = [lane.request_id for lane in self.running if lane.state is LaneState.FILL]
            burst = self.burst.active(
                {*filling, *(lane.request_id for lane in self.waiting)}, num_decode
            )
            plan = plan_round(
                self.mask_budget.runnable(self.running),  # costly grammars rest (mask_budget)
                self.share.prefill_budget(num_decode, bool(filling), whole_round=burst),
                cfg.prefill_chunk,
                cfg.block_size,
                lambda lane, n=num_decode: num_drafts(lane, n),
            )
            ends = {s.lane.request_id: (s.lane, s.end + s.num_drafts) for s in plan.steps}
            need = sum(lane.block_table.blocks_needed(end) for lane, end in ends.values())
            if need <= self.cache.num_available or len(self.running) <= 1:
                break
            self.preempt(self.running[-1])
        for lane, end in ends.values():
            lane.block_table.append(self.cache.allocate(lane.block_table.blocks_needed(end)))
        return plan

    def plan_alone(self, lane: Lane, num_drafts: Callable[[Lane, int], int]) -> None:
        """Plan this lane by itself, reserving nothing: raises where the lane cannot be planned
        (to find the lane that breaks a round's plan)."""
        cfg = self.config
        budget = cfg.max_tokens_per_round
        plan_round([lane], budget, cfg.prefill_chunk, cfg.block_size, lambda ln: num_drafts(ln, 1))

    def reserve(self, lanes: Sequence[Lane], ends: Sequence[int]) -> bool:
        """Blocks so that each lane holds positions < its end; False (nothing taken) where the
        pool has too few."""
        need = [lane.block_table.blocks_needed(end) for lane, end in zip(lanes, ends, strict=True)]
        if sum(need) > self.cache.num_available:
            return False
        for lane, n in zip(lanes, need, strict=True):
            if n:
                lane.block_table.append(self.cache.allocate(n))
        return True

    def preempt(self, lane: Lane) -> None:
        """Give the lane's blocks back (its whole blocks go to the prompt cache) and requeue it
        first; it recomputes what the cache no longer holds. No output is lost."""
        self.release(lane)
        lane.num_computed = 0
        lane.num_published = 0
        lane.state = LaneState.WAITING
        self.running.remove(lane)
        self.waiting.insert(0, lane)
        self.metrics.num_preemptions += 1

    # ---- blocks of lanes that move on or end ----------------------------------------------

    def key_blocks(self, lane: Lane) -> None:
        """Prompt-cache keys for the lane's blocks up to num_computed (its output's too), so a
        hybrid's state on an output block boundary can be kept under its block's key."""
        bs = self.config.block_size
        complete = lane.num_computed // bs
        if complete > len(lane.block_keys):
            tokens = lane.all_ids()[: complete * bs]
            lane.block_keys = self.cache.chain_keys(tokens, bs, lane.cache_salt, lane.block_keys)

    def publish(self, lane: Lane) -> None:
        """Offer the lane's whole computed blocks to the prompt cache (cancel_prefill, finish,
        preemption). Only blocks below num_computed: their forward has completed."""
        bs = self.config.block_size
        complete = lane.num_computed // bs
        if complete <= lane.num_published:
            return
        tokens = lane.all_ids()[: complete * bs]
        lane.block_keys = self.cache.chain_keys(tokens, bs, lane.cache_salt, lane.block_keys)
        for i in range(lane.num_published, complete):
            self.cache.publish(lane.block_keys[i], lane.block_table.blocks[i])
        lane.num_published = complete

    def trim(self, lane: Lane) -> None:
        """Blocks past the lane's known tokens (reserved for drafts it did not keep) go back."""
        self.cache.release(lane.block_table.truncate(lane.num_known))

    def release(self, lane: Lane) -> None:
        self.chunks.settle()  # at most the chunk in flight: what it computed is kept
        self.publish(lane)
        self.cache.release(lane.block_table.clear())
        if lane.slot >= 0:
            self._free_slots.append(lane.slot)
            lane.slot = -1
        if self.recurrent is not None:
            self.recurrent.release(lane)
        if self.proposer is not None:
            self.proposer.release(lane)

    def remove(self, lane: Lane) -> None:
        """The lane leaves: a running one releases what it holds, a waiting one its place."""
        if lane in self.running:
            self.release(lane)
            self.running.remove(lane)
        else:
            self.waiting.remove(lane)

    def check_integrity(self) -> None:
        """Blocks: every reference is a lane's or the cache's; nothing leaked (see PromptCache).
        Hybrids: every recurrent-state slot is free or a running lane's."""
        self.cache.check_integrity(lane.block_table.blocks for lane in self.running)
        if self.recurrent is not None:
            self.recurrent.check_integrity(self.running)
