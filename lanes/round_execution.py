"""Round execution: a planned round's host-managed forwards, run one after another, each read
back once, its tokens taken into the lanes.

Contract:
- `run(plan)` fills the plan's draft slots, runs `plan.forwards()` in order and returns the lanes
  that ended. Between forwards cancellations land (a prompt chunk late at most) and the server
  sees progress. A stage that raises is retried lane by lane (lanes/isolation.py).
- With overlap, a round of plain decode steps is launched and sampled on the device and left in
  flight (`inflight`, lanes/inflight.py); lanes/overlap.py takes it the next step.
- A mid-prompt chunk counts as computed only once its forward is seen complete
  (lanes/launched_chunks.py); a lane's KV is valid up to its last kept token's input, and
  rejected drafts' positions are rolled back (blocks, recurrent state, the drafter).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import torch

from lanes.drafting import Drafting
from lanes.inflight import InFlight, launch_samples
from lanes.isolation import fill_isolated, isolated
from lanes.lane import LaneState
from lanes.launched_chunks import LaunchedChunks
from lanes.mask_budget import MaskBudget
from lanes.mask_prefetch import MaskPrefetch
from lanes.output import Completion, Output
from lanes.recurrent import RecurrentStates
from lanes.round_book import RoundBook
from lanes.rounds import LaneRound, Step, lane_rows
from lanes.runner import ModelRunner
from lanes.scheduler import Scheduler
from lanes.speculation import coupled_branches_from_samples, coupled_from_samples
from lanes.verifier import Emitted, Verifier

log = logging.getLogger("lanes")


class RoundExecution:
    def __init__(
        self,
        runner: ModelRunner,
        scheduler: Scheduler,
        output: Output,
        drafting: Drafting,
        verifier: Verifier,
        recurrent: RecurrentStates | None,
        chunks: LaunchedChunks,
        book: RoundBook,
        mask_budget: MaskBudget,
        masks: MaskPrefetch,
        clock: Callable[[], float],
        *,
        overlap: bool,
        single_process: bool,
        progress: Callable[[], None],
        cancellations: Callable[[], list[Completion]],
    ) -> None:
        self.runner = runner
        self.scheduler = scheduler
        self.output = output
        self.drafting = drafting
        self.verifier = verifier
        self.recurrent = recurrent
        self.chunks = chunks
        self.book = book
        self.mask_budget = mask_budget
        self.masks = masks
        self.clock = clock
        self.overlap = overlap
        self.single_process = single_process
        self.progress = progress
        self.cancellations = cancellations
        self.inflight: InFlight | None = None  # a launched decode round not yet taken

    def run(self, plan: LaneRound, host_seconds: float) -> list[Completion]:
        metrics = self.drafting.metrics
        defer = self.overlap and not plan.prefill
        drafter_before = metrics.drafter_seconds
        start = self.clock()
        mark = self.book.begin()
        plan, ended = fill_isolated(self.drafting, plan, self.output.fail)
        self.masks.start(self.scheduler.running)  # next masks on a helper (opt-in)
        self.progress()
        num_prefill = num_decode = num_forwards = 0
        decode_steps = {id(s) for s in plan.decode}
        for group in plan.forwards():
            group = tuple(s for s in group if not s.lane.is_finished)  # cancelled mid-round
            if not group:
                continue
            if defer and all(self.overlappable(s) for s in group):
                ended += self._launch_deferred(group)
            else:
                ended += isolated(self.run_forward, list(group), self.output.fail)
            prefill = [s for s in group if id(s) not in decode_steps]
            ended += isolated(self.drafting.prefill, prefill, self.output.fail)
            self.chunks.settle(keep=1)  # the chunk before this one: a cancel waits for one
            num_forwards += 1
            num_decode += sum(s.num_tokens for s in group if id(s) in decode_steps)
            num_prefill += sum(s.num_tokens for s in prefill)
            ended += self.cancellations()
            self.progress()
        self.chunks.settle()
        seconds = self.clock() - start
        self.book.last_end = self.clock()
        self.mask_budget.end_round(self.scheduler.running, seconds)
        drafter_seconds = metrics.drafter_seconds - drafter_before
        if num_prefill == 0 and plan.decode and self.inflight is None:  # a whole decode round
            self.drafting.record_round(plan.decode, seconds, drafter_seconds)
        self.book.record(
            mark, num_prefill, num_decode, seconds,
            num_forwards=num_forwards, host_seconds=host_seconds,
            prefill_share=self.book.share.last_share or 0.0,
            drafts=sum(s.num_drafted for s in plan.decode), drafter_seconds=drafter_seconds,
        )  # fmt: skip
        return ended

    # ---- one forward ----------------------------------------------------------------------

    def run_forward(self, steps: Sequence[Step]) -> list[Completion]:
        logits = self.runner.execute(lane_rows(steps))  # [sum of num_logits, vocab], in order
        hidden_rows = None  # each step's rows of the forward's features
        if self.drafting.observing and any(self.drafting.drafting(s.lane) for s in steps):
            # one copy of the forward's rows for all its lanes (the next forward reuses them),
            # split into the steps' views in one call rather than a slice per step
            sizes = [s.num_rows for s in steps]
            hidden_rows = self.runner.last_hidden[: sum(sizes)].clone().split(sizes)
        sampled, steps = self.verifier.read_back(steps, logits)
        ended = []
        chunk_ends = []  # mid-prompt chunks: computed once the forward completes
        row = 0
        now = None if sampled is None else self.clock()  # sampled: the read-back has synced
        for i, s in enumerate(steps):
            rows_hidden = None if hidden_rows is None else hidden_rows[i]
            rows = slice(row, row + s.num_logits_rows)
            row += s.num_logits_rows
            try:
                if not s.samples:
                    chunk_ends.append((s.lane, s.end))
                    if self.recurrent is not None:  # copied now: the next chunk moves the state
                        self.recurrent.after_prefill(s.lane, s.end)
                    self.drafting.observe(s, rows_hidden, s.end)
                    continue
                branch = 0
                if sampled is not None and sampled[0][rows.start] is not None:
                    tokens, logprobs = sampled[0][rows], sampled[1][rows]
                    if s.branches:
                        emitted, branch = coupled_branches_from_samples(
                            s.draft_paths, tokens, logprobs
                        )
                    else:
                        emitted = coupled_from_samples(s.draft_ids, tokens, logprobs)
                    emitted = [(t, lp, None) for t, lp in emitted]
                elif s.branches:
                    emitted, branch = self.verifier.verify_branches_on_host(s, logits[rows])
                else:
                    emitted = self.verifier.verify_on_host(s, logits[rows])
                # the first token read back synchronises with the device: stamp times after it
                now = now if now is not None else self.clock()
                done = self.take_tokens(s, emitted, rows_hidden, now, branch)
            except Exception as e:  # this lane's sampling or output broke; the others go on
                ended.append(self.output.fail(s.lane, e))
                continue
            if done is not None:
                ended.append(done)
        self.chunks.launched(chunk_ends)
        return ended

    def take_tokens(
        self, s: Step, emitted: Emitted, hidden: torch.Tensor | None, now: float, branch: int = 0
    ) -> Completion | None:
        """Append one step's emitted tokens (token, logprob, top alternatives), which followed
        draft branch `branch` (0: the step's own drafts); the lane's Completion if it ended."""
        lane = s.lane
        lane.num_sampling_steps += 1
        if s.draft_ids:
            self.drafting.record_verify(lane, len(s.draft_ids), len(emitted) - 1)
        lane.state = LaneState.DECODE
        for token, logprob, top in emitted:
            self.output.append(lane, token, logprob, top, now)
            if lane.finish_reason is not None:
                break
        # KV is valid up to the last kept token's input; rejected drafts' positions are not.
        # Set before a lane that ends here is released, so its last chunk is published too.
        # (a step with branches: its root and the drafts kept on the branch followed)
        kept_end = s.start + len(emitted) if s.branches else s.end
        lane.num_computed = min(kept_end, lane.num_known - 1)
        if branch:  # the kept drafts' KV is in the branch's scratch: into the lane's blocks
            self.drafting.metrics.num_branches_followed += 1
            kept = range(s.start + 1, lane.num_computed)
            self.runner.adopt_branch(lane.slot, branch, s.start, kept)
            if hidden is not None:  # the features of the branch's rows
                first = s.num_tokens + sum(1 + len(b) for b in s.branches[: branch - 1])
                hidden = hidden[first:]
        if self.recurrent is not None:  # the state back to the last kept position; a snapshot
            self.recurrent.settle(lane)  # where the lane stands on a block boundary
            self.scheduler.key_blocks(lane)
            self.recurrent.after_prefill(lane)
        if lane.finish_reason is not None:
            return self.output.end(lane, LaneState.DONE)
        self.scheduler.trim(lane)
        self.drafting.observe(s, hidden)
        if s.draft_ids:
            self.drafting.accepted(lane)
        return None

    # ---- forwards left in flight (lanes/inflight.py) ---------------------------------------

    def overlappable(self, s: Step) -> bool:
        """A step whose round can overlap the next: one decode token, no drafts this round,
        sampled on the device (greedy or seeded, no top_logprobs), single process."""
        return (
            s.num_tokens == 1
            and s.num_logits == 1
            and s.num_drafted == 0
            and self.verifier.samples_on_device(s.lane.params)
            and self.single_process
        )

    def launch(self, steps: Sequence[Step], logits: torch.Tensor) -> InFlight:
        """Sample a forward's logits on the device, leaving the tokens in flight; an EAGLE-style
        drafter's features of the forward travel with them (copied: the next forward reuses the
        buffer), to be observed when the tokens are taken."""
        hidden = None
        if self.drafting.observing and any(self.drafting.drafting(s.lane) for s in steps):
            hidden = self.runner.last_hidden[: len(steps)].clone()
        return launch_samples(
            steps, logits, self.verifier.on_triton, hidden, self.runner.row_params
        )

    def _launch_deferred(self, group: tuple[Step, ...]) -> list[Completion]:
        """Run the forward and sample it on the device; its tokens are taken next step."""
        try:
            logits = self.runner.execute(lane_rows(group))
            self.inflight = self.launch(group, logits)
            return []
        except Exception:
            log.exception("a deferred decode forward failed; running it synchronously")
            self.inflight = None
            return isolated(self.run_forward, list(group), self.output.fail)
