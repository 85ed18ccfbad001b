"""Output: tokens join a lane's output (stop tokens, stop strings, length, detokenized text), and
lanes end into Completions.

Contract:
- `append` adds one token and sets `lane.finish_reason` when the lane is done ("stop" at a stop
  token or stop string — the text cut before it — "length" at max_tokens or the context's end).
  Callers stop appending a step's tokens at the first one that finishes the lane.
- `end` removes the lane from the scheduler (its whole computed blocks go to the prompt cache),
  adds its draft counts to the metrics and returns its Completion; `fail` ends a lane whose
  request broke something, with finish_reason "error", the others untouched.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

from lanes.grammar import GrammarFailed
from lanes.lane import Lane, LaneState
from lanes.mask_budget import MaskBudget
from lanes.mask_prefetch import MaskPrefetch
from lanes.metrics import EngineMetrics, add_counts
from lanes.scheduler import Scheduler

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
    # per token: an accepted draft or not, and where its text ends in `text` (lanes.draft_spans)
    from_draft: list[bool] = dataclasses.field(default_factory=list)
    text_ends: list[int] = dataclasses.field(default_factory=list)

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.arrival_time if self.token_times else None


class Output:
    def __init__(
        self,
        scheduler: Scheduler,
        metrics: EngineMetrics,
        eos_token_ids: frozenset[int],
        mask_budget: MaskBudget,
        masks: MaskPrefetch,
    ) -> None:
        self.scheduler = scheduler
        self.metrics = metrics
        self.eos_token_ids = eos_token_ids
        self.mask_budget = mask_budget
        self.masks = masks

    def append(self, lane: Lane, token: int, logprob: float, top: list | None, now: float) -> None:
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
        if is_stop_token or (
            p.stop and piece and cut_at_stop(lane, len(piece), p.include_stop_str_in_output)
        ):
            lane.finish_reason = "stop"
        elif lane.num_known >= self.scheduler.max_len(lane):
            lane.finish_reason = "length"
        lane.output_from_draft.append(lane.drafts_ahead > 0)
        lane.drafts_ahead = max(0, lane.drafts_ahead - 1)
        lane.output_text_ends.append(len(lane.text))

    def end(self, lane: Lane, state: LaneState) -> Completion:
        self.mask_budget.forget(lane.request_id)
        self.masks.forget(lane.request_id)
        m = self.metrics
        m.num_drafted += lane.num_drafted
        m.num_accepted += lane.num_accepted
        m.num_verify_steps += lane.num_verify_steps
        add_counts(m.drafted_at, lane.drafted_at)
        add_counts(m.accepted_at, lane.accepted_at)
        if lane.finish_reason == "length":
            lane.text += lane.detokenizer.flush()
        self.scheduler.remove(lane)
        lane.state = state
        return completion_of(lane)

    def fail(self, lane: Lane, error: BaseException) -> Completion:
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
        return self.end(lane, LaneState.CANCELLED)

    def cancel(self, lane: Lane) -> Completion:
        lane.finish_reason = "cancelled"
        self.metrics.num_cancellations += 1
        return self.end(lane, LaneState.CANCELLED)


def cut_at_stop(lane: Lane, num_new: int, keep_stop: bool = False) -> bool:
    """Cut the text at the first stop string (after it with keep_stop: vLLM's
    include_stop_str_in_output); only a match that takes new text can be new, so the search
    looks at the tail alone (a long output costs no more per token)."""
    longest = max(len(s) for s in lane.params.stop)
    tail = max(0, len(lane.text) - num_new - longest + 1)
    hits = [(i, s) for s in lane.params.stop if (i := lane.text.find(s, tail)) >= 0]
    if hits:
        start, stop = min(hits)
        lane.text = lane.text[: start + len(stop) if keep_stop else start]
    return bool(hits)


def completion_of(lane: Lane) -> Completion:
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
        from_draft=list(lane.output_from_draft),
        text_ends=list(lane.output_text_ends),
        top_logprobs=list(lane.output_top_logprobs),
        error=lane.error,
    )
