"""The engine: the thin loop that composes the parts of a lane round.

    step:  cancellations → admit → plan (scheduler)            lanes/intake.py, lanes/scheduler.py
           → drafts → forwards → verify → take tokens          lanes/drafting.py,
                                                               lanes/round_execution.py,
                                                               lanes/verifier.py
           → ended lanes as Completions                        lanes/output.py

A round in flight (overlap, lanes/overlap.py) or drafted rounds on the device
(lanes/device_round_driver.py) take the step's place while they run. A failure is kept to the
lanes it concerns (lanes/isolation.py). docs/architecture.md follows one request through.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from lanes.cache.block_pool import BlockPool
from lanes.cache.kv_pool import KVPool
from lanes.cache.prompt_cache import PromptCache
from lanes.config import EngineConfig
from lanes.device_round_driver import DeviceRoundDriver
from lanes.drafter import Proposer
from lanes.drafting import Drafting
from lanes.grammar import GrammarCompiler
from lanes.intake import Intake, Prompt, RequestError
from lanes.isolation import plan_isolated
from lanes.lane import Lane
from lanes.launched_chunks import LaunchedChunks
from lanes.mask_budget import MaskBudget
from lanes.mask_prefetch import MaskPrefetch
from lanes.metrics import EngineMetrics
from lanes.models import Checkpoint
from lanes.output import Completion, Output
from lanes.overlap import Overlap
from lanes.recurrent import RecurrentStates
from lanes.round_book import RoundBook
from lanes.round_execution import RoundExecution
from lanes.runner import ModelRunner
from lanes.sampling import SamplingParams
from lanes.scheduler import Scheduler
from lanes.scoring import score
from lanes.share import ShareAllocator
from lanes.verifier import Verifier

__all__ = ["Completion", "Engine", "Prompt", "RequestError"]

log = logging.getLogger("lanes")


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
        self.runner = runner
        bs = cfg.block_size
        self.bytes_per_block = KVPool.bytes_per_block(
            len(mc.attention_layers), bs, mc.num_kv_heads, mc.head_dim, self.dtype
        )
        # hybrids: each running lane's recurrent state, and snapshots of it for cached prefixes
        self.recurrent = None
        if runner.kv.states is not None:
            settle = runner.decoder.settle_states
            self.recurrent = RecurrentStates(
                runner.kv.states, cfg.state_snapshot_bytes, bs, settle,
                runner.decoder.ops.chunked_delta,
            )  # fmt: skip
        self.pool = BlockPool(runner.num_blocks)
        self.cache = PromptCache(
            self.pool, checkpoint.fingerprint, cfg.prompt_cache_bytes // self.bytes_per_block
        )
        self.share = ShareAllocator(cfg.prefill_share, bs, cfg.max_tokens_per_round)
        self.metrics = EngineMetrics()
        self.eos_token_ids = frozenset(self.tokenizer.eos_token_ids) | frozenset(mc.eos_token_ids)
        self.mask_budget = MaskBudget()  # grammar-mask time per lane (lanes/mask_budget.py)
        self.masks = MaskPrefetch(cfg.prefetch_masks)  # a mask beside the forward (opt-in)
        # Consulted between host-managed forwards: return True to cancel that request now.
        self.cancel_check: Callable[[int], bool] | None = None
        # Called once a round is planned and after each host-managed forward (a status snapshot
        # mid-round: on the CPU one prefill forward can take seconds).
        self.on_progress: Callable[[], None] = lambda: None
        self._build_parts(proposer, on_cuda=cfg.device.startswith("cuda"))
        if self.drafting.observing:  # the target keeps the features this drafter reads
            runner.decoder.feature_layers = proposer.target_feature_layers
            runner.decoder.feature_prenorm = proposer.target_features_prenorm

    def _build_parts(self, proposer: Proposer | None, on_cuda: bool) -> None:
        cfg, clock = self.config, self.clock
        self.intake = Intake(
            cfg, self.model_config, self.tokenizer, self.pool.num_blocks, self.eos_token_ids, clock
        )
        # prompt chunks launched but not yet seen complete: one stays queued behind the running
        # one, and only completed ones count as computed (lanes/launched_chunks.py)
        chunks = LaunchedChunks(torch.cuda.Event if on_cuda else None)
        self.scheduler = Scheduler(
            cfg, self.cache, self.recurrent, self.share, self.mask_budget, chunks, proposer,
            self.metrics, self.intake.context_len, clock,
        )  # fmt: skip
        self.output = Output(
            self.scheduler, self.metrics, self.eos_token_ids, self.mask_budget, self.masks
        )
        cost_aware = cfg.cost_aware_drafts if cfg.cost_aware_drafts is not None else on_cuda
        self.drafting = Drafting(
            cfg, proposer, self.metrics, self.scheduler.max_len, clock,
            cost_aware=cost_aware, device_drafts=self.comm is None,
            even_drafts=self.runner.graphs is not None,
            branches=self.runner.branches.branches if self.runner.branches and not self.comm else 1,
        )  # fmt: skip
        self.verifier = Verifier(
            cfg, self.ops.name == "triton", self.runner.row_params, self.masks, self.eos_token_ids
        )
        self.book = RoundBook(self.share, self.metrics, on_cuda, clock)
        overlap = cfg.overlap if cfg.overlap is not None else on_cuda
        hooks = {"progress": lambda: self.on_progress(), "cancellations": self._cancellations}
        self.execution = RoundExecution(
            self.runner, self.scheduler, self.output, self.drafting, self.verifier,
            self.recurrent, chunks, self.book, self.mask_budget, self.masks, clock,
            overlap=overlap, single_process=self.comm is None, **hooks,
        )  # fmt: skip
        device_rounds = None  # drafted rounds on the device, where the drafter can
        if proposer is not None and cfg.device_rounds is not False and self.comm is None:
            eager = bool(cfg.device_rounds)
            device_rounds = proposer.device_rounds(
                self.runner, cfg.num_draft_tokens, eager, self.drafting.branches
            )
        self.drafting.lazy_prefill = device_rounds is None  # device rounds seed from its rows
        self.device_driver = DeviceRoundDriver(
            device_rounds, self.scheduler, self.output, self.drafting, self.verifier, self.book,
            overlap=overlap, **hooks,
        )  # fmt: skip
        self.drafting.device_declines = self.device_driver.declines
        self.drafting.device_skips_prefill = self.device_driver.skips_prefill
        self.scheduler.drafter_skips_prompts = self.drafting.skips_prompts
        self.overlap = Overlap(
            self.execution, self.scheduler, self.drafting, self.output, self.book,
            hybrid=self.recurrent is not None, device_rounds_due=self.device_driver.due,
        )  # fmt: skip

    # ---- what callers read ----------------------------------------------------------------

    @property
    def context_len(self) -> int:
        """Prompt + output tokens a request may reach: the model's context, or less with
        EngineConfig.max_model_len."""
        return self.intake.context_len

    @property
    def proposer(self) -> Proposer | None:
        return self.drafting.proposer

    @proposer.setter
    def proposer(self, proposer: Proposer | None) -> None:
        """Swap the drafter between requests (tests and benches compare drafters on one target;
        device rounds stay those of the drafter the engine was built with)."""
        self.drafting.proposer = self.scheduler.proposer = proposer

    @property
    def waiting(self) -> list[Lane]:
        return self.scheduler.waiting

    @property
    def running(self) -> list[Lane]:
        return self.scheduler.running

    @property
    def grammars(self) -> GrammarCompiler:
        return self.intake.grammars

    @property
    def device_rounds(self):
        """The drafted rounds on the device (lanes/device_rounds.py), or None."""
        return self.device_driver.device_rounds

    def has_work(self) -> bool:
        return bool(self.scheduler.waiting or self.scheduler.running)

    def check_integrity(self) -> None:
        self.scheduler.check_integrity()

    # ---- requests -------------------------------------------------------------------------

    def encode(self, prompt: Prompt) -> list[int]:
        return self.intake.encode(prompt)

    def make_lane(self, prompt: Prompt, params: SamplingParams, cache_salt: str = "") -> Lane:
        """Validate a request and make its lane, not yet queued (any thread: lanes/intake.py)."""
        return self.intake.make_lane(prompt, params, cache_salt)

    def enqueue(self, lane: Lane) -> None:
        """Queue a lane made by make_lane (on the engine's thread)."""
        self.scheduler.waiting.append(lane)

    def submit(self, prompt: Prompt, params: SamplingParams, cache_salt: str = "") -> Lane:
        """Validate and queue a request; its lane shows progress (output_ids, text) as it runs."""
        lane = self.make_lane(prompt, params, cache_salt)
        self.enqueue(lane)
        return lane

    def add_request(self, prompt: Prompt, params: SamplingParams, cache_salt: str = "") -> int:
        return self.submit(prompt, params, cache_salt).request_id

    def cancel(self, request_id: int) -> None:
        """Cancel a request; takes effect at the next step boundary (its prefix is kept)."""
        self.intake.cancel(request_id)

    def cached_prefix_len(self, prompt: Prompt, cache_salt: str = "") -> int:
        """Tokens of this prompt's prefix the prompt cache holds now (whole blocks)."""
        return self.scheduler.cached_prefix_len(self.encode(prompt), cache_salt)

    # ---- one round ------------------------------------------------------------------------

    def step(self) -> list[Completion]:
        """Run one lane round; return the requests that ended in it (finished, cancelled, or
        failed). A stage that raises for several lanes is retried one lane at a time, and only
        the lanes that fail alone end, with finish_reason "error".

        With overlap, a round of plain decode steps leaves its tokens on the device; the next
        step launches the round after it on top of them before it takes them, and falls back
        to a planned round whenever that cannot be done."""
        if self.execution.inflight is not None:
            ended, in_flight = self.overlap.step()
            return ended if in_flight else ended + self.step()
        if self.device_driver.active:
            return self.device_driver.step()
        host_start = self.clock()
        ended = self._cancellations()
        ended += [self.output.fail(lane, e) for lane, e in self.scheduler.admit()]
        self.drafting.device_due = self.device_driver.due()
        num_drafts = self.drafting.round_drafts(self.scheduler.running)
        plan, failed = plan_isolated(self.scheduler, num_drafts, self.output.fail)
        ended += failed
        if not plan.steps:
            return ended
        host_seconds = self.clock() - host_start
        on_device = self.device_driver.take_over(plan)
        if on_device is not None:
            return ended + on_device
        return ended + self.execution.run(plan, host_seconds)

    def _cancellations(self) -> list[Completion]:
        lanes = self.scheduler.waiting + self.scheduler.running
        return [
            self.output.cancel(lane) for lane in self.intake.cancelled(lanes, self.cancel_check)
        ]

    # ---- whole requests -------------------------------------------------------------------

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
        self.scheduler.waiting.extend(lanes)  # all valid, or none queued
        ids = [lane.request_id for lane in lanes]
        done: dict[int, Completion] = {}
        while not all(i in done for i in ids):
            for c in self.step():
                done[c.request_id] = c
        return [done[i] for i in ids]

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
        return score(prompts, keep_features, self.intake, self.cache, self.recurrent, self.runner)
