"""The engine: admits requests into lanes, runs lane rounds, samples, and ends lanes.

One round = admit → plan (share allocator picks the prefill budget; blocks are reserved, lanes
preempted if the pool is full) → host-managed forwards (cancellations are applied between them)
→ sample → publish and release finished lanes.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from lanes.cache.block_pool import BlockPool
from lanes.cache.block_table import BlockTable
from lanes.cache.kv_pool import KVPool
from lanes.cache.prompt_cache import PromptCache
from lanes.chat import Chat
from lanes.config import EngineConfig
from lanes.detokenize import IncrementalDetokenizer
from lanes.device_sampling import sample_rows, to_host
from lanes.draft_costs import (
    DEVICE_MEASURE,
    DEVICE_PAUSE,
    DEVICE_STALE,
    PLAIN_EVERY,
    PROBE_EVERY,
    DeviceRoundCosts,
    DraftCosts,
)
from lanes.drafter import Proposer
from lanes.grammar import GrammarCompiler, GrammarFailed, apply_mask
from lanes.inflight import InFlight, launch_samples
from lanes.lane import Lane, LaneState
from lanes.launched_chunks import LaunchedChunks
from lanes.mask_budget import MaskBudget
from lanes.mask_prefetch import MaskPrefetch
from lanes.metrics import EngineMetrics, RoundRecord, add_counts
from lanes.models import Checkpoint
from lanes.penalties import RowContext, process_logits, process_rows
from lanes.prompt_bounds import check_prompt_chars
from lanes.recurrent import RecurrentStates
from lanes.round_clock import RoundClock
from lanes.rounds import LaneRound, Step, lane_rows, plan_round
from lanes.runner import ModelRunner
from lanes.sampling import SamplingParams
from lanes.share import ShareAllocator
from lanes.speculation import (
    choose_num_drafts,
    coupled_from_samples,
    processes_on_device,
    record_verify,
    samples_on_device,
    verify,
)

# A prompt is text, token ids, chat messages ([{"role": ..., "content": ...}, ...]), or messages
# with tools for a template that renders them itself (lanes.chat.Chat).
Prompt = str | list[int] | list[dict] | Chat


class RequestError(ValueError):
    """A request lanes cannot serve (too long, empty, bad ids): the engine keeps running."""


log = logging.getLogger("lanes")


@dataclass(frozen=True)
class Completion:
    request_id: int
    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str  # "stop" | "length" | "cancelled" | "error"
    logprobs: list[float]  # log-probability of each chosen token under the sampled distribution
    cached_tokens: int  # prompt tokens found in the prompt cache at admission
    arrival_time: float  # engine clock
    token_times: list[float]  # engine clock at each output token
    first_scheduled_time: float | None = None  # engine clock when it first got a lane
    num_drafted: int = 0  # draft tokens verified for this request
    num_accepted: int = 0  # of them, kept
    num_target_steps: int = 0  # target forwards that yielded this request's tokens
    top_logprobs: list[list[tuple[int, float]]] = dataclasses.field(default_factory=list)
    error: str | None = None  # finish_reason "error": the exception's type (the log has the rest)

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.arrival_time if self.token_times else None


class Engine:
    def __init__(
        self,
        config: EngineConfig,
        checkpoint: Checkpoint,
        runner: ModelRunner,
        proposer: Proposer | None = None,
        *,
        clock: Callable[[], float] = time.perf_counter,
        comm=None,
    ) -> None:
        """Parts come built (lanes.build.build_engine is the one place that builds them): the
        runner holds the target and its KV; comm is a lanes.parallel.Comm when this engine is
        rank 0 of a tensor-parallel group."""
        self.config = cfg = config
        self.model_config = mc = checkpoint.config  # its context cut to max_model_len (build)
        self.tokenizer = checkpoint.tokenizer
        self.fingerprint = checkpoint.fingerprint
        self.source = checkpoint.source
        self.clock = clock
        self.dtype = runner.kv.dtype
        self.ops = runner.decoder.ops
        self.comm = comm
        bs = cfg.block_size
        self.bytes_per_block = KVPool.bytes_per_block(
            len(mc.attention_layers), bs, mc.num_kv_heads, mc.head_dim, self.dtype
        )
        # hybrids: each running lane's recurrent state, and snapshots of it for cached prefixes
        self.recurrent = (
            None
            if runner.kv.states is None
            else RecurrentStates(
                runner.kv.states, cfg.state_snapshot_bytes, bs, runner.decoder.settle_states
            )
        )
        self.pool = BlockPool(runner.num_blocks)
        self.cache = PromptCache(
            self.pool, checkpoint.fingerprint, cfg.prompt_cache_bytes // self.bytes_per_block
        )
        self.runner = runner
        self.share = ShareAllocator(cfg.prefill_share, bs, cfg.max_tokens_per_round)
        self.metrics = EngineMetrics()
        self.eos_token_ids = frozenset(self.tokenizer.eos_token_ids) | frozenset(mc.eos_token_ids)
        self._grammars: GrammarCompiler | None = None
        self.mask_budget = MaskBudget()  # grammar-mask time per lane (lanes/mask_budget.py)
        self.masks = MaskPrefetch(cfg.prefetch_masks)  # a mask beside the forward (opt-in)
        self.proposer = proposer
        if self._observing:  # the target keeps the features this drafter reads
            self.runner.decoder.feature_layers = self.proposer.target_feature_layers
        self.waiting: list[Lane] = []
        self.running: list[Lane] = []
        self._free_slots = list(range(cfg.max_lanes - 1, -1, -1))  # rows of the block tables
        # Consulted between host-managed forwards: return True to cancel that request now.
        self.cancel_check: Callable[[int], bool] | None = None
        # Called once a round is planned and after each host-managed forward (a status snapshot
        # mid-round: on the CPU one prefill forward can take seconds).
        self.on_progress: Callable[[], None] = lambda: None
        self._cancel_requested: set[int] = set()
        self._ids = itertools.count()
        # overlapped rounds: the launched decode round whose tokens are not yet taken
        on_cuda = cfg.device.startswith("cuda")
        self._overlap = cfg.overlap if cfg.overlap is not None else on_cuda
        self._cost_aware = cfg.cost_aware_drafts if cfg.cost_aware_drafts is not None else on_cuda
        self._inflight: InFlight | None = None
        # prompt chunks launched but not yet seen complete: one stays queued behind the running
        # one, and only completed ones count as computed (lanes/launched_chunks.py)
        self._chunks = LaunchedChunks(torch.cuda.Event if on_cuda else None)
        self.round_clock = RoundClock(on_cuda)  # rounds' device time, for the share allocator
        self._last_round_end = clock()
        self.draft_costs = DraftCosts()  # what drafting costs here, measured (adaptive k)
        self._num_decoding = 0  # decode lanes of the round being planned
        # drafted rounds on the device (lanes/device_rounds.py), where the drafter can
        self.device_rounds = None
        if proposer is not None and cfg.device_rounds is not False and comm is None:
            self.device_rounds = proposer.device_rounds(
                runner, cfg.num_draft_tokens, eager=bool(cfg.device_rounds)
            )
        self._device_rounds_broken = False
        self.device_costs = DeviceRoundCosts()  # whether they pay here (with cost-aware drafts)
        # device rounds judged not to pay for these requests: not started again before this
        # metrics.num_rounds while only they run (new requests are judged afresh)
        self._device_paused_until = 0
        self._device_paused_for: frozenset[int] = frozenset()
        self._device_due = False  # device rounds could start at the round being planned
        self._forward_measured_at = 0  # metrics.num_rounds at the last plain round measured

    @property
    def context_len(self) -> int:
        """Prompt + output tokens a request may reach: the model's context, or less with
        EngineConfig.max_model_len."""
        cap = self.config.max_model_len
        own = self.model_config.max_position_embeddings
        return own if cap is None else min(own, cap)

    # ---- requests -------------------------------------------------------------------------

    def encode(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        if isinstance(prompt, Chat):
            return self.tokenizer.encode_chat(prompt.messages, prompt.tools)
        if prompt and all(isinstance(m, dict) for m in prompt):
            return self.tokenizer.encode_chat(prompt)
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return list(prompt)
        raise RequestError("a prompt is a string, a list of token ids, or a list of messages")

    def add_request(self, prompt: Prompt, params: SamplingParams, cache_salt: str = "") -> int:
        return self.submit(prompt, params, cache_salt).request_id

    def submit(self, prompt: Prompt, params: SamplingParams, cache_salt: str = "") -> Lane:
        """Validate and queue a request; its lane shows progress (output_ids, text) as it runs."""
        lane = self.make_lane(prompt, params, cache_salt)
        self.enqueue(lane)
        return lane

    def enqueue(self, lane: Lane) -> None:
        """Queue a lane made by make_lane (on the engine's thread)."""
        self.waiting.append(lane)

    def cached_prefix_len(self, prompt: Prompt, cache_salt: str = "") -> int:
        """Tokens of this prompt's prefix the prompt cache holds now (whole blocks)."""
        bs = self.config.block_size
        keys = self.cache.chain_keys(self.encode(prompt), bs, cache_salt, [])
        matching = self.cache.num_matching(keys)
        if self.recurrent is not None:
            matching = self.recurrent.resumable(keys[:matching])
        return matching * bs

    def cancel(self, request_id: int) -> None:
        """Cancel a request; takes effect at the next step boundary (its prefix is kept)."""
        self._cancel_requested.add(request_id)

    def make_lane(self, prompt: Prompt, params: SamplingParams, cache_salt: str = "") -> Lane:
        """Validate a request and make its lane, not yet queued. Reads only what never changes
        (tokenizer, shapes, pool size), so another thread may call it while rounds run."""
        try:
            cache_salt.encode()
        except UnicodeEncodeError as e:
            raise RequestError("cache_salt is not valid Unicode (an unpaired surrogate)") from e
        try:  # before tokenizing: a text too long for the context costs nothing to refuse
            check_prompt_chars(prompt, self.context_len, self.tokenizer.max_token_chars)
        except ValueError as e:
            raise RequestError(str(e)) from e
        ids = self.encode(prompt)
        vocab = self.model_config.vocab_size
        if not ids:
            raise RequestError("the prompt is empty")
        if any(not 0 <= t < vocab for t in ids):
            raise RequestError(f"prompt token ids must be in [0, {vocab})")
        if any(not 0 <= t < vocab for t, _ in params.logit_bias):
            raise RequestError(f"logit_bias token ids must be in [0, {vocab})")
        if len(ids) >= self.context_len:
            raise RequestError(
                f"the prompt has {len(ids)} tokens; the model's context is {self.context_len} "
                "tokens and at least one must be left to generate"
            )
        table = BlockTable(self.config.block_size)
        if table.blocks_needed(len(ids) + 1) > self.pool.num_blocks:
            raise RequestError(
                f"the prompt has {len(ids)} tokens; the KV cache holds "
                f"{self.pool.num_blocks * self.config.block_size} (raise kv_cache_bytes)"
            )
        cursor = None
        if params.grammar is not None:  # compiled here, so a bad schema is this request's error
            try:
                cursor = self.grammars.cursor(params.grammar)
            except ValueError as e:
                raise RequestError(str(e)) from e
        return Lane(
            request_id=next(self._ids),
            prompt_ids=ids,
            params=params.with_seed(),
            block_table=table,
            detokenizer=IncrementalDetokenizer(self.tokenizer, ids),
            cache_salt=cache_salt,
            arrival_time=self.clock(),
            grammar_cursor=cursor,
        )

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- one round ------------------------------------------------------------------------

    def step(self) -> list[Completion]:
        """Run one lane round; return the requests that ended in it (finished, cancelled, or
        failed). A failure is kept to the lanes it concerns: a stage that raises for several
        lanes is retried one lane at a time, and only the lanes that fail alone end, with
        finish_reason "error"; the others go on as if nothing happened.

        With overlap, a round of plain (undrafted) decode steps leaves its tokens on the device
        (lanes.inflight); the next step launches the round after it on top of them before it
        takes them, and falls back to a planned round whenever that cannot be done."""
        if self._inflight is not None:
            return self._step_on_top()
        if self.device_rounds is not None and self.device_rounds.lanes:
            return self._step_device_rounds()
        host_start = self.clock()
        ended = self._apply_cancellations()
        ended += self._admit()
        plan, failed = self._plan_isolated()
        ended += failed
        if not plan.steps:
            return ended
        host_seconds = self.clock() - host_start
        if self._device_rounds_fit(plan):
            dr = self.device_rounds
            if dr.start([s.lane for s in plan.decode]):
                if self._launch_device_round():
                    return ended + self._device_round(launched=True, start=self.clock())
                self._stop_device_rounds()  # the head's pool is full: host-managed this round
        defer = self._overlap and not plan.prefill
        drafter_before = self.metrics.drafter_seconds
        start = self.clock()
        mark = self.round_clock.begin()
        plan, failed = self._fill_drafts_isolated(plan)
        ended += failed
        self.masks.start(self.running)  # next masks on a helper, beside the forward (opt-in)
        self.on_progress()
        num_prefill = num_decode = num_forwards = 0
        decode_steps = {id(s) for s in plan.decode}
        for group in plan.forwards():
            group = tuple(s for s in group if not s.lane.is_finished)  # cancelled mid-round
            if not group:
                continue
            if defer and all(self._overlappable(s) for s in group):
                ended += self._launch_deferred(group)
            else:
                ended += self._isolated(self._run_forward, list(group))
            prefill = [s for s in group if id(s) not in decode_steps]
            ended += self._isolated(self._drafter_prefill, prefill)
            self._chunks.settle(keep=1)  # the chunk before this one: a cancel waits for one
            num_forwards += 1
            num_decode += sum(s.num_tokens for s in group if id(s) in decode_steps)
            num_prefill += sum(s.num_tokens for s in prefill)
            ended += self._apply_cancellations()
            self.on_progress()
        self._chunks.settle()
        seconds = self.clock() - start
        self._last_round_end = self.clock()
        self.mask_budget.end_round(self.running, seconds)
        self.round_clock.end(mark, num_prefill, num_decode, seconds)
        if num_prefill == 0 and plan.decode and self._inflight is None:  # a whole decode round
            drafts = [s.num_drafted for s in plan.decode]
            drafter_seconds = self.metrics.drafter_seconds - drafter_before
            self.draft_costs.record(
                sum(drafts), max(drafts), seconds - drafter_seconds, drafter_seconds
            )
            if not sum(drafts):
                self._forward_measured_at = self.metrics.num_rounds
        self._feed_share()
        self.metrics.add(
            RoundRecord(
                prefill_tokens=num_prefill,
                decode_tokens=num_decode,
                num_forwards=num_forwards,
                seconds=seconds,
                host_seconds=host_seconds,
                prefill_share=self.share.last_share or 0.0,
            )
        )
        return ended

    # ---- overlapped rounds (lanes/inflight.py) ---------------------------------------------

    def _overlappable(self, s: Step) -> bool:
        """A step whose round can overlap the next: one decode token, no drafts this round,
        sampled on the device (greedy or seeded, no top_logprobs), single process."""
        return (
            s.num_tokens == 1
            and s.num_logits == 1
            and s.num_drafted == 0
            and self._samples_on_device(s.lane.params)
            and self.comm is None
        )

    def _samples_on_device(self, params: SamplingParams) -> bool:
        return samples_on_device(params, self.config.verify_mode)

    def _launch(self, steps: Sequence[Step], logits: torch.Tensor) -> InFlight:
        """Sample a forward's logits on the device, leaving the tokens in flight; an EAGLE-style
        drafter's features of the forward travel with them (copied: the next forward reuses the
        buffer), to be observed when the tokens are taken."""
        hidden = None
        if self._observing and any(self._drafting(s.lane) for s in steps):
            hidden = self.runner.last_hidden[: len(steps)].clone()
        return launch_samples(
            steps, logits, self.ops.name == "triton", hidden, self.runner.row_params
        )

    def _launch_deferred(self, group: tuple[Step, ...]) -> list[Completion]:
        """Run the forward and sample it on the device; its tokens are taken next step."""
        try:
            logits = self.runner.execute(lane_rows(group))
            self._inflight = self._launch(group, logits)
            return []
        except Exception:
            log.exception("a deferred decode forward failed; running it synchronously")
            self._inflight = None
            return self._isolated(self._run_forward, list(group))

    def _step_on_top(self) -> list[Completion]:
        """Launch round N+1 on round N's device tokens, then take round N's tokens (waiting for
        N alone). When N+1 cannot be launched that way, take N and run a planned round."""
        last, self._inflight = self._inflight, None
        steps: tuple[Step, ...] = ()
        mark = self.round_clock.begin()
        try:
            steps = self._steps_on_top(last)
            if steps:
                logits = self.runner.execute(lane_rows(steps), previous_tokens=last.tokens)
                self._inflight = self._launch(steps, logits)
        except Exception:  # the planned round reruns these lanes with its own boundaries
            log.exception("launching a round on top of the previous one failed")
            self._inflight = None
        ended = self._take_inflight(last)
        ended += self._apply_cancellations()
        if self._inflight is None:
            return ended + self.step()
        seconds = self.clock() - self._last_round_end
        self._last_round_end = self.clock()
        self.draft_costs.record(0, 0, seconds, 0.0)  # a plain round, as it runs overlapped
        self._forward_measured_at = self.metrics.num_rounds
        self._record_unplanned_round(len(steps), seconds, overlapped=True, mark=mark)
        return ended

    def _record_unplanned_round(
        self, tokens: int, seconds: float, overlapped: bool, mark=None
    ) -> None:
        """A decode round launched without a plan (on top of the last one, or a device round):
        its time for the share allocator (device time from `mark`, RoundClock.begin, where
        given; device rounds give wall time) and the metrics; no host time is counted (planning
        and taking ran while a forward did)."""
        self.round_clock.end(mark, 0, tokens, seconds)
        self._feed_share()
        self.metrics.add(
            RoundRecord(
                prefill_tokens=0,
                decode_tokens=tokens,
                num_forwards=1,
                seconds=seconds,
                host_seconds=0.0,
                prefill_share=0.0,
                overlapped=overlapped,
            )
        )

    def _feed_share(self) -> None:
        """Rounds whose device time is known now go to the share allocator."""
        for prefill_tokens, decode_tokens, seconds in self.round_clock.measured():
            self.share.record(prefill_tokens, decode_tokens, seconds)
        self.metrics.achieved_prefill_share = self.share.achieved_share

    def _steps_on_top(self, last: InFlight) -> tuple[Step, ...]:
        """Each live lane of `last` decodes its pending token next, if nothing else needs a
        planned round: no lane waits to be admitted, every running lane is in `last`, and the
        blocks fit. A lane that ends by length in `last` gets no step."""
        live = [(i, s) for i, s in enumerate(last.steps) if not s.lane.is_finished]
        if self.waiting or len(live) != len(self.running):
            return ()
        self._device_due = self._device_rounds_due()
        if self._device_due:  # a planned round starts them
            return ()
        if any(self._num_drafts(s.lane) for _, s in live):  # a drafter needs the newest token
            return ()
        if self._snapshot_due([s for _, s in live]):
            return ()
        steps = [
            Step(s.lane, s.end, s.end + 1, num_logits=1, pending_row=i)
            for i, s in live
            if s.lane.num_known + 1 < self._max_len(s.lane)
        ]
        need = [s.lane.block_table.blocks_needed(s.end) for s in steps]
        if sum(need) > self.cache.num_available:
            return ()
        for s, n in zip(steps, need, strict=True):
            if n:
                s.lane.block_table.append(self.cache.allocate(n))
        return tuple(steps)

    def _snapshot_due(self, steps: list[Step]) -> bool:
        """Hybrids: a step ends on a block boundary, where its lane's state is kept as a snapshot
        when its tokens are taken; a round launched on top first would move the state on."""
        bs = self.config.block_size
        return self.recurrent is not None and any(s.end % bs == 0 for s in steps)

    def _take_inflight(self, last: InFlight) -> list[Completion]:
        """Append the tokens of a launched round to its lanes (skipping lanes that ended since)."""
        tokens, logprobs = last.results()
        now = self.clock()
        ended = []
        for i, (s, token, logprob) in enumerate(zip(last.steps, tokens, logprobs, strict=True)):
            if s.lane.is_finished:
                continue
            hidden = None if last.hidden is None else last.hidden[i : i + 1]
            try:
                done = self._take_tokens(s, [(token, logprob, None)], hidden, now)
            except Exception as e:
                ended.append(self._fail(s.lane, e))
                continue
            if done is not None:
                ended.append(done)
        self.on_progress()
        return ended

    # ---- drafted rounds on the device (lanes/device_rounds.py) -------------------------------

    def _device_lane(self, lane: Lane) -> bool:
        """A lane the device rounds can carry now: drafting, sampled on the device, and far
        enough from the end of its context that the next two rounds stay within it. (Rounds
        past max_tokens are fine: their positions are computed, but no token past the end is
        emitted, and the lane ends there.)"""
        dr = self.device_rounds
        return (
            not lane.is_finished
            and lane.state is LaneState.DECODE
            and self._drafting(lane)
            and self._samples_on_device(lane.params)
            and dr.reach(lane) <= min(dr.target.max_ctx, dr.head.max_ctx)
        )

    def _device_paused(self) -> bool:
        """Device rounds were judged not to pay for the running requests (acceptance is theirs:
        a request that joins since is judged afresh)."""
        return self.metrics.num_rounds < self._device_paused_until and all(
            lane.request_id in self._device_paused_for for lane in self.running
        )

    def _device_lanes_ready(self, lanes: Sequence[Lane]) -> bool:
        """These lanes are every running lane, nothing waits, and each is a device lane."""
        return (
            not self.waiting
            and len(lanes) == len(self.running)
            and all(self._device_lane(lane) for lane in lanes)
        )

    def _device_rounds_due(self) -> bool:
        """Whether device rounds could start now: not paused, and the running lanes ready.
        Then plain overlapped rounds give way to a planned round, and cost-aware k does not
        stop drafting (device rounds judge their own cost)."""
        if self.device_rounds is None or self._device_paused():
            return False
        return self._device_lanes_ready(self.running)

    def _reserve_reach(self, lanes: Sequence[Lane]) -> bool:
        """Target blocks for every position the next round may write; False (nothing taken)
        where the pool has too few."""
        dr = self.device_rounds
        need = [lane.block_table.blocks_needed(dr.reach(lane)) for lane in lanes]
        if sum(need) > self.cache.num_available:
            return False
        for lane, n in zip(lanes, need, strict=True):
            if n:
                lane.block_table.append(self.cache.allocate(n))
        return True

    def _device_rounds_fit(self, plan: LaneRound) -> bool:
        """A planned round the device rounds can take over: decode steps of every running lane,
        nothing waiting or filling, each lane a device lane, and blocks for their reach."""
        if self.device_rounds is None or plan.prefill or not plan.decode or self._device_paused():
            return False
        lanes = [s.lane for s in plan.decode]
        return self._device_lanes_ready(lanes) and self._reserve_reach(lanes)

    def _step_device_rounds(self) -> list[Completion]:
        """Launch the next device round when every lane can go on (same lanes, nothing new
        waiting), then take the oldest in flight; else take them all and end the rounds."""
        dr = self.device_rounds
        verdict = "go"
        if self._cost_aware:
            stale = self.metrics.num_rounds - self._forward_measured_at > DEVICE_STALE
            verdict = self.device_costs.verdict(self.draft_costs.forward, stale)
        if verdict != "go":  # a plain round is faster, or was not measured (lately)
            pause = DEVICE_PAUSE if verdict == "pause" else DEVICE_MEASURE
            c = self.device_costs
            log.info(
                "device rounds %s: %.2f tokens per lane in %.2f ms per round; plain round %s",
                "paused" if verdict == "pause" else "stopped to measure a plain round",
                c.tokens,
                c.seconds * 1e3,
                "not measured" if self.draft_costs.forward is None
                else f"{self.draft_costs.forward * 1e3:.2f} ms",
            )  # fmt: skip
            self._device_paused_until = self.metrics.num_rounds + pause
            self._device_paused_for = frozenset(lane.request_id for lane in dr.lanes)
        go_on = (
            verdict == "go" and self._device_lanes_ready(dr.lanes) and self._reserve_reach(dr.lanes)
        )
        return self._device_round(go_on and self._launch_device_round(), self._last_round_end)

    def _launch_device_round(self) -> bool:
        """dr.launch(); a launch that raises turns device rounds off for this engine (logged):
        the rounds in flight are still taken, and later rounds are host-managed."""
        try:
            return self.device_rounds.launch()
        except Exception:
            log.exception("launching a device round failed; drafted rounds are host-managed now")
            self._device_rounds_broken = True
            return False

    def _device_round(self, launched: bool, start: float) -> list[Completion]:
        """Take what the launch leaves to take, and end the rounds when none was launched."""
        dr = self.device_rounds
        ended, emitted = [], None  # emitted: tokens per lane of the last round taken
        # with overlap one round stays in flight while the host takes the one before it
        while len(dr.pending) > (1 if launched and self._overlap else 0):
            done, emitted = self._take_device_round()
            ended += done
        if not launched:
            ended += self._stop_device_rounds()
        ended += self._apply_cancellations()
        seconds = self.clock() - start
        self._last_round_end = self.clock()
        if launched:
            if emitted is not None:
                self.device_costs.record(emitted, seconds)
            self._record_unplanned_round(len(dr.lanes) * (dr.k + 1), seconds, self._overlap)
        return ended

    def _take_device_round(self) -> tuple[list[Completion], float | None]:
        """Mirror the oldest device round into its lanes (skipping lanes that ended since):
        the lanes that ended, and the round's tokens per live lane (None: no lane was)."""
        dr = self.device_rounds
        results = dr.take()
        now = self.clock()
        ended, emitted = [], []
        for lane, r in zip(dr.lanes, results, strict=True):
            if lane.is_finished:
                continue
            emitted.append(r.accepted + 1)
            try:
                if r.verify_start != lane.num_known - 1:
                    raise RuntimeError(
                        f"device round verified from position {r.verify_start}; the lane's "
                        f"newest token is at {lane.num_known - 1}"
                    )
                lane.num_sampling_steps += 1
                record_verify(lane, dr.k, r.accepted)
                dr.drafter.device_settle(lane, r.verify_start)
                for token, logprob in r.emitted:
                    self._append(lane, token, logprob, None, now)
                    if lane.finish_reason is not None:
                        break
                lane.num_computed = lane.num_known - 1
            except Exception as e:
                ended.append(self._fail(lane, e))
                continue
            if lane.finish_reason is not None:
                ended.append(self._end(lane, LaneState.DONE))
        self.on_progress()
        return ended, (sum(emitted) / len(emitted) if emitted else None)

    def _stop_device_rounds(self) -> list[Completion]:
        """End the device rounds (none in flight): live lanes' heads take their pending
        features back, and blocks past their known tokens return to the pool."""
        dr = self.device_rounds
        live = [lane for lane in dr.lanes if not lane.is_finished]
        dr.stop({i for i, lane in enumerate(dr.lanes) if not lane.is_finished})
        for lane in live:
            self.cache.release(lane.block_table.truncate(lane.num_known))
            self.proposer.accepted(lane)
        if self._device_rounds_broken:
            self.device_rounds = None
        self.device_costs.restart()  # judged afresh when they start again
        return []

    # ---- error boundaries -----------------------------------------------------------------

    def _fail(self, lane: Lane, error: BaseException) -> Completion:
        """End a lane whose request broke something: it alone fails. Its whole computed blocks
        still go to the prompt cache (their forwards completed before the failure)."""
        log.error("request %d failed: %s", lane.request_id, error, exc_info=error)
        self.metrics.num_failures += 1
        lane.finish_reason = "error"
        # what the client sees: the type (the log has the message), and why where it is the
        # request's own doing
        lane.error = type(error).__name__
        if isinstance(error, GrammarFailed):
            lane.error += f": {error}"
        return self._end(lane, LaneState.CANCELLED)

    def _isolated(
        self, stage: Callable[[list[Step]], list[Completion] | None], steps: list[Step]
    ) -> list[Completion]:
        """Run stage(steps), which returns the lanes it ended (or None); if it raises, rerun it
        one step at a time and fail the lanes whose step fails alone. For stages that change no
        lane before they can raise; batch-invariant numerics make a lane's rerun alone give the
        tokens it would have had in the batch."""
        steps = [s for s in steps if not s.lane.is_finished]
        if not steps:
            return []
        try:
            return stage(steps) or []
        except Exception as e:
            if len(steps) == 1:
                return [self._fail(steps[0].lane, e)]
            log.exception("a round stage failed for %d lanes; rerunning each alone", len(steps))
        ended = []
        for s in steps:
            try:
                ended += stage([s]) or []
            except Exception as e:
                ended.append(self._fail(s.lane, e))
        return ended

    def _plan_isolated(self) -> tuple[LaneRound, list[Completion]]:
        """Plan the round; if planning raises, fail the lanes that cannot be planned alone."""
        try:
            return self._plan(), []
        except Exception:
            log.exception("planning a round failed; planning each lane alone")
        failed = []
        for lane in list(self.running):
            try:
                cfg = self.config
                budget = cfg.max_tokens_per_round
                plan_round([lane], budget, cfg.prefill_chunk, cfg.block_size, self._num_drafts)
            except Exception as e:
                failed.append(self._fail(lane, e))
        try:
            return self._plan(), failed
        except Exception as e:  # not any one lane's fault: every running lane fails
            failed += [self._fail(lane, e) for lane in list(self.running)]
            return LaneRound((), (), self.config.prefill_chunk), failed

    def _fill_drafts_isolated(self, plan: LaneRound) -> tuple[LaneRound, list[Completion]]:
        """Drafts for the plan; a lane whose drafts fail alone fails (its step is dropped)."""
        try:
            return self._fill_drafts(plan), []
        except Exception:
            log.exception("proposing drafts failed; proposing for each lane alone")

        def propose(steps: list[Step]) -> None:
            self.proposer.propose([s.lane for s in steps], [s.num_drafts for s in steps])

        failed = self._isolated(propose, [s for s in plan.decode if s.num_drafts])
        keep = tuple(s for s in plan.decode if not s.lane.is_finished)
        plan = dataclasses.replace(plan, decode=keep)
        try:
            return self._fill_drafts(plan), failed
        except Exception as e:  # not any one lane's fault: drafting lanes fail
            failed += [self._fail(s.lane, e) for s in plan.decode if s.num_drafts]
            keep = tuple(s for s in plan.decode if not s.lane.is_finished)
            return dataclasses.replace(plan, decode=keep), failed

    def _run_forward(self, steps: Sequence[Step]) -> list[Completion]:
        logits = self.runner.execute(lane_rows(steps))  # [sum of num_logits, vocab], in order
        hidden = self.runner.last_hidden if self._observing else None
        sampled, steps = self._read_back(steps, logits)
        ended = []
        chunk_ends = []  # mid-prompt chunks: computed once the forward completes
        row = hidden_row = 0
        now = None if sampled is None else self.clock()  # sampled: the read-back has synced
        for s in steps:
            rows_hidden = None if hidden is None else hidden[hidden_row : hidden_row + s.num_tokens]
            hidden_row += s.num_tokens
            rows = slice(row, row + s.num_logits)
            row += s.num_logits
            try:
                if not s.samples:
                    chunk_ends.append((s.lane, s.end))
                    if self.recurrent is not None:  # copied now: the next chunk moves the state
                        self.recurrent.after_prefill(s.lane, s.end)
                    self._observe(s, rows_hidden, s.end)
                    continue
                if sampled is not None and sampled[0][rows.start] is not None:
                    tokens, logprobs = sampled[0][rows], sampled[1][rows]
                    emitted = coupled_from_samples(s.draft_ids, tokens, logprobs)
                    emitted = [(t, lp, None) for t, lp in emitted]
                else:
                    emitted = self._verify_on_host(s, logits[rows])
                # the first token read back synchronises with the device: stamp times after it
                now = now if now is not None else self.clock()
                done = self._take_tokens(s, emitted, rows_hidden, now)
            except Exception as e:  # this lane's sampling or output broke; the others go on
                ended.append(self._fail(s.lane, e))
                continue
            if done is not None:
                ended.append(done)
        self._chunks.launched(chunk_ends)
        return ended

    def _read_back(
        self, steps: Sequence[Step], logits: torch.Tensor
    ) -> tuple[tuple[list, list] | None, list[Step]]:
        """What the host needs of a forward, in one copy: with the Triton kernels, the rows of
        every lane that samples on the device (greedy or position-keyed), sampled in one launch;
        and the drafts of verify steps whose drafts are still on the device. Returns (tokens,
        logprobs) by logits row (None for rows not sampled here; None: no row was), and the
        steps with their draft ids on the host."""
        where = []  # logits rows the device samples
        how = []  # (params, position) of each of them
        processed = []  # (index in steps, first logits row) of steps processed on the device
        row = 0
        for i, s in enumerate(steps):
            if not s.samples:
                continue
            if self.ops.name == "triton" and self._samples_on_device(s.lane.params):
                where += range(row, row + s.num_logits)
                first = s.first_sample_position
                how += [(s.lane.params, first + j) for j in range(s.num_logits)]
            elif self._processed_on_device(s.lane.params):
                processed.append((i, row))
            row += s.num_logits
        sources = list(
            {
                id(s.draft_source): s.draft_source for s in steps if s.draft_source is not None
            }.values()
        )
        if not where and not sources and not processed:
            return None, list(steps)
        parts = []
        if where:
            rows = logits
            if len(where) < logits.shape[0]:
                rows = logits[torch.tensor(where).to(logits.device, non_blocking=True)]
            parts += sample_rows(rows, how, True, self.runner.row_params)
        values = to_host(*parts, *sources)
        by_source = {id(src): v for src, v in zip(sources, values[len(parts) :], strict=True)}
        steps = [
            s
            if s.draft_source is None
            else dataclasses.replace(
                s,
                draft_ids=tuple(int(by_source[id(s.draft_source)][r]) for r in s.draft_rows),
                draft_rows=(),
                draft_source=None,
            )
            for s in steps
        ]
        by_row: tuple[list, list] = ([None] * row, [None] * row)
        for i, r in enumerate(where):
            by_row[0][r], by_row[1][r] = int(values[0][i]), values[1][i]
        if processed:  # their rows' masks and penalties need the drafts on the host first
            at, tokens, logprobs = self._sample_processed(
                [(steps[i], first) for i, first in processed], logits
            )
            for i, r in enumerate(at):
                by_row[0][r], by_row[1][r] = int(tokens[i]), logprobs[i]
        return by_row, steps

    def _held_by_min_tokens(self, p: SamplingParams) -> frozenset[int]:
        """The tokens min_tokens holds back: the stop ids, and EOS unless ignored."""
        return frozenset(p.stop_token_ids) | (frozenset() if p.ignore_eos else self.eos_token_ids)

    def _processed_on_device(self, params: SamplingParams) -> bool:
        """A lane whose logits processing (grammar, penalties, logit_bias, min_p, min_tokens)
        runs batched on the device, its rows then sampled by the device sampler. Never in an
        overlapped round or a device round: its next row's mask needs this row's token."""
        return self.ops.name == "triton" and processes_on_device(params, self.config.verify_mode)

    def _sample_processed(
        self, steps: Sequence[tuple[Step, int]], logits: torch.Tensor
    ) -> tuple[list[int], list[float], list[float]]:
        """The rows of (step, its first logits row) pairs whose processing runs on the device:
        each row's context (the lane's prompt, output and the drafts before the row; its grammar
        mask), processed in one batch (lanes.penalties.process_rows) and sampled in one launch.
        Returns (logits rows, tokens, logprobs). A grammar's masks stop at the first draft it
        forbids: that row's sample cannot equal the draft, so no later row of the step is used."""
        at, contexts, how = [], [], []
        for s, row in steps:
            lane, p = s.lane, s.lane.params
            stops = self._held_by_min_tokens(p)
            allowed = None
            for j in range(s.num_logits):
                history = self._row_history(s, j)
                if lane.grammar_cursor is not None and (
                    allowed is None or bool(allowed[history[-1]])
                ):
                    allowed = self.masks.allowed(lane, history)
                at.append(row + j)
                contexts.append(RowContext(p, lane.prompt_ids, history, stops, allowed))
                how.append((p, s.first_sample_position + j))
        rows = logits[torch.tensor(at).to(logits.device, non_blocking=True)]
        tokens, logprobs = to_host(*sample_rows(process_rows(rows, contexts), how, True))
        return at, tokens, logprobs

    @property
    def grammars(self) -> GrammarCompiler:
        """Structured outputs' matchers for this engine's tokenizer (built at first use)."""
        if self._grammars is None:
            self._grammars = GrammarCompiler(
                self.tokenizer.to_json(), self.model_config.vocab_size, self.eos_token_ids
            )
        return self._grammars

    def _verify_on_host(
        self, s: Step, rows: torch.Tensor
    ) -> list[tuple[int, float, list[tuple[int, float]] | None]]:
        """Sample and verify one step's logits rows [num_logits, vocab] row by row (the CPU path,
        rejection verification, top_logprobs): tokens with logprob and top alternatives."""
        p, lane = s.lane.params, s.lane
        process = None
        if p.processes_logits:  # penalties etc. over the output so far and the drafts before
            stops = self._held_by_min_tokens(p)

            def process(j: int, row: torch.Tensor) -> torch.Tensor:
                history = self._row_history(s, j)
                if lane.grammar_cursor is not None:  # the grammar first: min_p then sees
                    row = apply_mask(row, self.masks.allowed(lane, history))  # allowed only
                return process_logits(row, p, lane.prompt_ids, history, stops)

        emitted = verify(
            self.config.verify_mode,
            rows,
            s.draft_ids,
            s.draft_logprobs,
            p,
            s.first_sample_position,
            process,
        )
        out = []
        for token, logprobs in emitted:
            top = None
            if p.top_logprobs:
                best = torch.topk(logprobs, p.top_logprobs)
                top = list(zip(best.indices.tolist(), best.values.tolist(), strict=True))
            out.append((token, float(logprobs[token]), top))
        return out

    @staticmethod
    def _row_history(s: Step, j: int) -> list[int]:
        """The output before row j of a sampling step: the lane's, then the drafts before j."""
        return s.lane.output_ids + list(s.draft_ids[:j])

    def _take_tokens(
        self,
        s: Step,
        emitted: list[tuple[int, float, list[tuple[int, float]] | None]],
        hidden: torch.Tensor | None,
        now: float,
    ) -> Completion | None:
        """Append one step's emitted tokens (token, logprob, top alternatives); the lane's
        Completion if it ended."""
        lane = s.lane
        lane.num_sampling_steps += 1
        if s.draft_ids:
            record_verify(lane, len(s.draft_ids), len(emitted) - 1)
        lane.state = LaneState.DECODE
        for token, logprob, top in emitted:
            self._append(lane, token, logprob, top, now)
            if lane.finish_reason is not None:
                break
        # KV is valid up to the last kept token's input; rejected drafts' positions are not.
        # Set before a lane that ends here is released, so its last chunk is published too.
        lane.num_computed = min(s.end, lane.num_known - 1)
        if self.recurrent is not None:  # the state back to the last kept position; a snapshot
            self.recurrent.settle(lane)  # where the lane stands on a block boundary
            self._key_blocks(lane)
            self.recurrent.after_prefill(lane)
        if lane.finish_reason is not None:
            return self._end(lane, LaneState.DONE)
        self.cache.release(lane.block_table.truncate(lane.num_known))
        self._observe(s, hidden)
        if self.proposer is not None and s.draft_ids:
            self.proposer.accepted(lane)
        return None

    @property
    def _observing(self) -> bool:
        return self.proposer is not None and self.proposer.uses_target_hidden

    def _observe(self, s: Step, hidden: torch.Tensor | None, end: int | None = None) -> None:
        """Hand an EAGLE-style drafter the target's features of the step's settled positions
        (up to `end`; by default the lane's computed ones)."""
        end = s.lane.num_computed if end is None else end
        if hidden is not None and self._drafting(s.lane) and end > s.start:
            self.proposer.observe(s.lane, s.start, hidden[: end - s.start])

    def _drafting(self, lane: Lane) -> bool:
        return self.proposer is not None and lane.params.draft and self.config.num_draft_tokens > 0

    def _num_drafts(self, lane: Lane) -> int:
        """Draft slots for a decode lane: adaptive k, within what the lane may still emit."""
        if not self._drafting(lane):
            return 0
        room = self._max_len(lane) - lane.num_known - 1  # the target always adds one token
        k = self.config.num_draft_tokens
        if self.config.adaptive_drafts:
            k = choose_num_drafts(lane, k)
            if self._cost_aware and not self._device_due:
                k = self._paying_drafts(lane, k)
        return max(0, min(k, room))

    def _paying_drafts(self, lane: Lane, k: int) -> int:
        """At most k drafts, as many as pay for themselves by the measured costs (see
        lanes/draft_costs.py); plain rounds and one-token probes keep the costs measured."""
        costs = self.draft_costs
        if costs.forward is None or self.metrics.num_rounds % PLAIN_EVERY == PLAIN_EVERY - 1:
            return 0  # this round measures what a round without drafts costs
        if not costs.measured:
            return k
        best = costs.best_k(lane.acceptance_ema, k, max(1, self._num_decoding))
        if best == 0 and lane.num_sampling_steps % PROBE_EVERY == 0:
            return 1  # a probe: is this lane's acceptance still too low to pay?
        return best

    def _fill_drafts(self, plan: LaneRound) -> LaneRound:
        """Ask the proposer for the planned draft slots; decode steps become verify steps."""
        wanting = [s for s in plan.decode if s.num_drafts]
        if not wanting:
            return plan
        start = self.clock()
        drafts = self.proposer.propose([s.lane for s in wanting], [s.num_drafts for s in wanting])
        by_lane = {id(s.lane): d for s, d in zip(wanting, drafts, strict=True)}
        decode = []
        for s in plan.decode:
            d = by_lane.get(id(s.lane))
            if d is None or not d.num_tokens:
                decode.append(s)
                continue
            if d.source is not None and self.comm is None:  # fed to the verify on the device
                rows = d.rows[: s.num_drafts]
                n, drafts = len(rows), {"draft_rows": rows, "draft_source": d.source}
            else:
                ids = d.host_ids()[: s.num_drafts]
                lp = d.logprobs[: len(ids)] if d.logprobs is not None else None
                n, drafts = len(ids), {"draft_ids": ids, "draft_logprobs": lp}
            decode.append(dataclasses.replace(s, end=s.end + n, num_logits=1 + n, **drafts))
        self.metrics.drafter_seconds += self.clock() - start
        return dataclasses.replace(plan, decode=tuple(decode))

    def _drafter_prefill(self, steps: list[Step]) -> None:
        """The drafter computes the same prompt chunks, in the same round."""
        if self.proposer is None:
            return
        steps = [s for s in steps if self._drafting(s.lane)]
        if steps:
            start = self.clock()
            self.proposer.prefill(steps)
            self.metrics.drafter_seconds += self.clock() - start

    # ---- admission, planning, preemption --------------------------------------------------

    def _admit(self) -> list[Completion]:
        """Waiting lanes join in order while a lane slot and blocks for a first chunk are free.
        A joining lane starts from the longest cached prefix of its known tokens. Returns the
        lanes that failed to join."""
        failed = []
        while self.waiting and len(self.running) < self.config.max_lanes:
            lane = self.waiting[0]
            try:
                matched = self._match_prefix(lane)
            except Exception as e:
                failed.append(self._fail(lane, e))
                continue
            bs = self.config.block_size
            first_end = min(lane.num_known, len(matched) * bs + self.config.prefill_chunk)
            if self.running and -(-first_end // bs) - len(matched) > self.cache.num_available:
                self.cache.release(matched)
                break
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
            self.running.append(self.waiting.pop(0))
        return failed

    def _match_prefix(self, lane: Lane) -> list[int]:
        """The cached blocks of the lane's longest cached prefix (referenced for the lane)."""
        bs = self.config.block_size
        tokens = lane.all_ids()
        lane.block_keys = self.cache.chain_keys(tokens, bs, lane.cache_salt, lane.block_keys)
        usable = min(len(lane.block_keys), (len(tokens) - 1) // bs)  # recompute >= 1 token
        matched = self.cache.match(lane.block_keys[:usable])
        if self.recurrent is not None:  # hybrids resume only as far as a state snapshot reaches
            keep = self.recurrent.resumable(lane.block_keys[: len(matched)])
            self.cache.release(matched[keep:])
            matched = matched[:keep]
        return matched

    def _plan(self) -> LaneRound:
        """Plan a round whose blocks fit; preempt the newest lanes until they do."""
        cfg = self.config
        self._device_due = self._device_rounds_due()
        while True:
            num_decode = sum(lane.state is LaneState.DECODE for lane in self.running)
            self._num_decoding = num_decode
            filling = any(lane.state is LaneState.FILL for lane in self.running)
            budget = self.share.prefill_budget(num_decode, filling)
            plan = plan_round(
                self.mask_budget.runnable(self.running),  # costly grammars rest (mask_budget)
                budget,
                cfg.prefill_chunk,
                cfg.block_size,
                self._num_drafts,
            )
            ends: dict[int, tuple[Lane, int]] = {}
            for s in plan.steps:
                ends[s.lane.request_id] = (s.lane, s.end + s.num_drafts)
            need = sum(lane.block_table.blocks_needed(end) for lane, end in ends.values())
            if need <= self.cache.num_available or len(self.running) <= 1:
                break
            self._preempt(self.running[-1])
        for lane, end in ends.values():
            lane.block_table.append(self.cache.allocate(lane.block_table.blocks_needed(end)))
        return plan

    def _preempt(self, lane: Lane) -> None:
        """Give the lane's blocks back (its whole blocks go to the prompt cache) and requeue it
        first; it recomputes what the cache no longer holds. No output is lost."""
        self._release(lane)
        lane.num_computed = 0
        lane.num_published = 0
        lane.state = LaneState.WAITING
        self.running.remove(lane)
        self.waiting.insert(0, lane)
        self.metrics.num_preemptions += 1

    # ---- ending lanes ---------------------------------------------------------------------

    def _apply_cancellations(self) -> list[Completion]:
        check = self.cancel_check
        ended = []
        for lane in list(self.waiting) + list(self.running):
            rid = lane.request_id
            if rid in self._cancel_requested or (check is not None and check(rid)):
                lane.finish_reason = "cancelled"
                ended.append(self._end(lane, LaneState.CANCELLED))
                self.metrics.num_cancellations += 1
        self._cancel_requested.clear()  # ids of ended or unknown requests are dropped too
        return ended

    def _key_blocks(self, lane: Lane) -> None:
        """Prompt-cache keys for the lane's blocks up to num_computed (its output's too), so a
        hybrid's state on an output block boundary can be kept under its block's key."""
        bs = self.config.block_size
        complete = lane.num_computed // bs
        if complete > len(lane.block_keys):
            tokens = lane.all_ids()[: complete * bs]
            lane.block_keys = self.cache.chain_keys(tokens, bs, lane.cache_salt, lane.block_keys)

    def _publish(self, lane: Lane) -> None:
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

    def _release(self, lane: Lane) -> None:
        self._chunks.settle()  # at most the chunk in flight: what it computed is kept
        self._publish(lane)
        self.cache.release(lane.block_table.clear())
        if lane.slot >= 0:
            self._free_slots.append(lane.slot)
            lane.slot = -1
        if self.recurrent is not None:
            self.recurrent.release(lane)
        if self.proposer is not None:
            self.proposer.release(lane)

    def _end(self, lane: Lane, state: LaneState) -> Completion:
        self.mask_budget.forget(lane.request_id)
        self.masks.forget(lane.request_id)
        self.metrics.num_drafted += lane.num_drafted
        self.metrics.num_accepted += lane.num_accepted
        self.metrics.num_verify_steps += lane.num_verify_steps
        add_counts(self.metrics.drafted_at, lane.drafted_at)
        add_counts(self.metrics.accepted_at, lane.accepted_at)
        if lane.finish_reason == "length":
            lane.text += lane.detokenizer.flush()
        if lane in self.running:
            self._release(lane)
            self.running.remove(lane)
        else:
            self.waiting.remove(lane)
        lane.state = state
        return Completion(
            request_id=lane.request_id,
            prompt_ids=lane.prompt_ids,
            token_ids=list(lane.output_ids),
            text=lane.text,
            finish_reason=lane.finish_reason or "stop",
            logprobs=list(lane.output_logprobs),
            cached_tokens=lane.cached_tokens,
            arrival_time=lane.arrival_time,
            token_times=list(lane.token_times),
            first_scheduled_time=lane.first_scheduled_time,
            num_drafted=lane.num_drafted,
            num_accepted=lane.num_accepted,
            num_target_steps=lane.num_sampling_steps,
            top_logprobs=list(lane.output_top_logprobs),
            error=lane.error,
        )

    def _max_len(self, lane: Lane) -> int:
        """Last length the lane can reach: prompt + max_tokens, within context and KV pool."""
        cap = min(self.context_len, self.pool.num_blocks * self.config.block_size)
        return min(len(lane.prompt_ids) + lane.params.max_tokens, cap)

    def _append(self, lane: Lane, token: int, logprob: float, top: list | None, now: float) -> None:
        p = lane.params
        lane.output_ids.append(token)
        lane.output_logprobs.append(logprob)
        if top is not None:
            lane.output_top_logprobs.append(top)
        lane.token_times.append(now)
        piece = lane.detokenizer.push(token)
        lane.text += piece
        is_stop_token = (
            token in self.eos_token_ids and not p.ignore_eos
        ) or token in p.stop_token_ids
        if is_stop_token or (p.stop and piece and self._cut_at_stop(lane, len(piece))):
            lane.finish_reason = "stop"
        elif lane.num_known >= self._max_len(lane):
            lane.finish_reason = "length"

    @staticmethod
    def _cut_at_stop(lane: Lane, num_new: int) -> bool:
        """Cut the text at the first stop string; only a match that takes new text can be new,
        so the search looks at the tail alone (a long output costs no more per token)."""
        longest = max(len(s) for s in lane.params.stop)
        tail = max(0, len(lane.text) - num_new - longest + 1)
        hits = [i for i in (lane.text.find(s, tail) for s in lane.params.stop) if i >= 0]
        if hits:
            lane.text = lane.text[: min(hits)]
        return bool(hits)

    def check_integrity(self) -> None:
        """Blocks: every reference is a lane's or the cache's; nothing leaked (see PromptCache).
        Hybrids: every recurrent-state slot is free or a running lane's."""
        self.cache.check_integrity(lane.block_table.blocks for lane in self.running)
        if self.recurrent is not None:
            self.recurrent.check_integrity(self.running)

    # ---- whole requests -------------------------------------------------------------------

    def prompt_logits(self, prompts: list[Prompt]) -> list[torch.Tensor]:
        """Next-token logits [len(prompt), vocab] at every position of every prompt, all prompts in
        one forward (for scoring, prompt logprobs, and the batch-invariance tests)."""
        return [logits for logits, _ in self._score(prompts, keep_features=False)]

    def prompt_logits_and_features(
        self, prompts: list[Prompt]
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """prompt_logits, with each prompt's features [len(prompt), hidden]: final-norm rows, or
        the rows of the decoder's `feature_layers` when a drafter asked for them (what an
        EAGLE-style drafter reads)."""
        return self._score(prompts, keep_features=True)

    def _score(self, prompts: list[Prompt], keep_features: bool) -> list[tuple]:
        lanes = [self.make_lane(p, SamplingParams(max_tokens=1)) for p in prompts]
        need = sum(lane.block_table.blocks_needed(lane.num_known) for lane in lanes)
        if need > self.cache.num_available:
            raise RequestError(
                f"scoring needs {need} KV blocks, {self.cache.num_available} are free"
            )
        states = None if self.recurrent is None else self.recurrent.pool
        if states is not None and len(lanes) > states.num_free:
            raise RequestError(
                f"scoring needs {len(lanes)} recurrent-state slots, {states.num_free} are free"
            )
        for i, lane in enumerate(lanes):  # table rows past the running lanes' own
            lane.slot = self.config.max_lanes + i
            lane.block_table.append(
                self.cache.allocate(lane.block_table.blocks_needed(lane.num_known))
            )
            if states is not None:
                lane.state_slot = states.allocate()
        try:
            steps = [Step(lane, 0, lane.num_known) for lane in lanes]
            logits = self.runner.execute(lane_rows(steps), all_logits=True)
            hidden = self.runner.last_hidden.clone() if keep_features else None
        finally:
            for lane in lanes:
                self.cache.release(lane.block_table.clear())
                if states is not None:
                    states.release(lane.state_slot)
        sizes = [lane.num_known for lane in lanes]
        features = hidden.split(sizes) if keep_features else [None] * len(lanes)
        return list(zip(logits.split(sizes), features, strict=True))

    def generate(
        self,
        prompts: list[Prompt],
        params: SamplingParams | list[SamplingParams],
        cache_salt: str = "",
    ) -> list[Completion]:
        """Run every prompt to its end, all in the same lane rounds; results in input order."""
        per = params if isinstance(params, list) else [params] * len(prompts)
        if len(per) != len(prompts):
            raise RequestError("one SamplingParams per prompt, or one for all")
        lanes = [self.make_lane(p, sp, cache_salt) for p, sp in zip(prompts, per, strict=True)]
        self.waiting.extend(lanes)  # all valid, or none queued
        ids = [lane.request_id for lane in lanes]
        done: dict[int, Completion] = {}
        while not all(i in done for i in ids):
            for c in self.step():
                done[c.request_id] = c
        return [done[i] for i in ids]
