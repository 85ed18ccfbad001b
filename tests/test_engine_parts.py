"""The engine's parts on their own, with no model: the scheduler (admission, the plan, preemption,
publication), output (stops, ends), drafting (draft slots, verify steps) and failure isolation.
Lanes here are plain Lane objects; nothing runs a forward."""

from __future__ import annotations

import pytest

from lanes.cache.block_pool import BlockPool
from lanes.cache.block_table import BlockTable
from lanes.cache.prompt_cache import PromptCache
from lanes.config import EngineConfig
from lanes.drafter.base import Draft, Proposer
from lanes.drafting import Drafting, choose_num_drafts, record_verify
from lanes.isolation import isolated, plan_isolated
from lanes.lane import Lane, LaneState
from lanes.launched_chunks import LaunchedChunks
from lanes.mask_budget import MaskBudget
from lanes.mask_prefetch import MaskPrefetch
from lanes.metrics import EngineMetrics
from lanes.output import Output
from lanes.rounds import Step
from lanes.sampling import SamplingParams
from lanes.scheduler import Scheduler
from lanes.share import ShareAllocator

BS = 4


class Letters:
    """A detokenizer stand-in: token t is the letter chr(97 + t % 26)."""

    def push(self, token: int) -> str:
        return chr(97 + token % 26)

    def flush(self) -> str:
        return ""


def make_lane(rid: int, prompt: list[int], **params) -> Lane:
    params.setdefault("max_tokens", 8)
    return Lane(
        request_id=rid,
        prompt_ids=list(prompt),
        params=SamplingParams(seed=1, **params),
        block_table=BlockTable(BS),
        detokenizer=Letters(),
    )


def parts(num_blocks: int = 16, max_lanes: int = 4, chunk: int = 8, proposer=None):
    cfg = EngineConfig(
        block_size=BS, prefill_chunk=chunk, max_lanes=max_lanes, max_tokens_per_round=64,
        prefill_share=1.0,
    )  # fmt: skip
    metrics = EngineMetrics()
    cache = PromptCache(BlockPool(num_blocks), "fingerprint", max_blocks=num_blocks)
    budget = MaskBudget()
    scheduler = Scheduler(
        cfg, cache, None, ShareAllocator(1.0, BS, 64), budget, LaunchedChunks(None), proposer,
        metrics, context_len=64, clock=lambda: 0.0,
    )  # fmt: skip
    output = Output(scheduler, metrics, frozenset({0}), budget, MaskPrefetch(False))
    return scheduler, output, metrics


def no_drafts(lane: Lane, num_decoding: int) -> int:
    return 0


# ---- scheduler ----------------------------------------------------------------------------


def test_admission_in_order_within_the_lane_slots():
    scheduler, _, _ = parts(max_lanes=2)
    lanes = [make_lane(i, [1, 2, 3, 4, 5]) for i in range(3)]
    scheduler.waiting.extend(lanes)
    assert scheduler.admit() == []
    assert scheduler.running == lanes[:2] and scheduler.waiting == lanes[2:]
    assert [lane.state for lane in lanes[:2]] == [LaneState.FILL] * 2
    assert sorted(lane.slot for lane in lanes[:2]) == [0, 1]


def test_the_plan_chunks_prompts_on_block_boundaries_and_reserves_their_blocks():
    scheduler, _, _ = parts(chunk=8)
    lane = make_lane(0, list(range(1, 14)))  # 13 tokens
    scheduler.waiting.append(lane)
    scheduler.admit()
    plan = scheduler.plan(no_drafts)
    assert [(s.start, s.end, s.num_logits) for s in plan.prefill] == [(0, 8, 0), (8, 13, 1)]
    assert len(lane.block_table.blocks) == 4 and lane.block_table.blocks_needed(13) == 0
    scheduler.check_integrity()


def test_a_published_prefix_is_matched_by_an_identical_prompt():
    scheduler, output, metrics = parts()
    prompt = list(range(1, 12))  # 11 tokens: two whole blocks
    first = make_lane(0, prompt)
    scheduler.waiting.append(first)
    scheduler.admit()
    scheduler.plan(no_drafts)
    first.num_computed = 11  # as if its forwards completed
    output.cancel(first)  # publishes its whole blocks, then releases the lane
    assert metrics.num_cancellations == 1
    again = make_lane(1, prompt)
    scheduler.waiting.append(again)
    scheduler.admit()
    assert again.num_computed == again.cached_tokens == 2 * BS
    scheduler.check_integrity()


def test_negative_control_nothing_is_matched_without_publication():
    scheduler, output, _ = parts()
    scheduler.publish = lambda lane: None
    prompt = list(range(1, 12))
    first = make_lane(0, prompt)
    scheduler.waiting.append(first)
    scheduler.admit()
    scheduler.plan(no_drafts)
    first.num_computed = 11
    output.cancel(first)
    again = make_lane(1, prompt)
    scheduler.waiting.append(again)
    scheduler.admit()
    assert again.num_computed == 0


def test_a_full_pool_preempts_the_newest_lane_and_requeues_it_first():
    scheduler, _, metrics = parts(num_blocks=6, chunk=16)
    old, new = make_lane(0, list(range(1, 17))), make_lane(1, list(range(21, 37)))
    scheduler.waiting.extend([old, new])
    scheduler.admit()  # both join: the pool holds a first chunk of each ...
    plan = scheduler.plan(no_drafts)  # ... but not both whole prompts: the newest goes
    assert metrics.num_preemptions == 1
    assert scheduler.running == [old] and scheduler.waiting == [new]
    assert new.state is LaneState.WAITING and new.num_computed == 0 and not new.block_table.blocks
    assert [s.lane for s in plan.steps] == [old]
    scheduler.check_integrity()


def test_only_blocks_below_num_computed_are_published():
    scheduler, _, _ = parts()
    lane = make_lane(0, list(range(1, 14)))
    scheduler.waiting.append(lane)
    scheduler.admit()
    scheduler.plan(no_drafts)  # blocks for 13 positions reserved, none computed yet
    lane.num_computed = BS + 1
    scheduler.publish(lane)
    assert lane.num_published == 1  # one whole block: its forward completed
    assert scheduler.cache.num_cached == 1


# ---- output -------------------------------------------------------------------------------


def running_lane(scheduler, **params) -> Lane:
    lane = make_lane(0, [1, 2, 3], **params)
    scheduler.waiting.append(lane)
    scheduler.admit()
    return lane


def test_a_stop_string_cuts_the_text_and_ends_the_lane():
    scheduler, output, _ = parts()
    lane = running_lane(scheduler, stop=("cd",))
    for token in (1, 2, 3):  # b, c, d
        output.append(lane, token, -0.5, None, now=1.0)
        if lane.finish_reason:
            break
    assert (lane.text, lane.finish_reason) == ("b", "stop")
    done = output.end(lane, LaneState.DONE)
    assert (done.text, done.token_ids, done.finish_reason) == ("b", [1, 2, 3], "stop")
    assert not scheduler.running


def test_eos_ends_unless_ignored_and_max_tokens_ends_by_length():
    scheduler, output, _ = parts()
    lane = running_lane(scheduler)
    output.append(lane, 0, -0.1, None, now=1.0)  # 0 is EOS here
    assert lane.finish_reason == "stop"
    scheduler, output, _ = parts()
    lane = running_lane(scheduler, ignore_eos=True, max_tokens=2)
    output.append(lane, 0, -0.1, None, now=1.0)
    assert lane.finish_reason is None
    output.append(lane, 0, -0.1, None, now=1.0)
    assert lane.finish_reason == "length"


def test_a_failure_ends_its_lane_with_an_error_and_keeps_the_others():
    scheduler, output, metrics = parts()
    lanes = [make_lane(i, [1, 2, 3]) for i in range(2)]
    scheduler.waiting.extend(lanes)
    scheduler.admit()
    done = output.fail(lanes[0], ValueError("bad"))
    assert (done.finish_reason, done.error) == ("error", "ValueError")
    assert scheduler.running == [lanes[1]] and metrics.num_failures == 1
    scheduler.check_integrity()


# ---- drafting -----------------------------------------------------------------------------


class Fixed(Proposer):
    def propose(self, lanes, num_drafts, num_branches=None):
        return [Draft(tuple(range(7, 7 + k))) for k in num_drafts]


def test_fill_turns_decode_steps_into_verify_steps():
    scheduler, _, metrics = parts()
    cfg = EngineConfig(block_size=BS, num_draft_tokens=3, adaptive_drafts=False)
    drafting = Drafting(cfg, Fixed(), metrics, scheduler.max_len, lambda: 0.0,
                        cost_aware=False, device_drafts=True)  # fmt: skip
    lane = running_lane(scheduler, max_tokens=20)
    lane.state, lane.num_computed = LaneState.DECODE, 2
    assert drafting.num_drafts(lane, 1) == 3
    plan = scheduler.plan(drafting.num_drafts)
    (verify,) = drafting.fill(plan).decode
    assert (verify.start, verify.end, verify.draft_ids, verify.num_logits) == (2, 6, (7, 8, 9), 4)


def test_draft_slots_stay_within_what_the_lane_may_emit():
    scheduler, _, metrics = parts()
    cfg = EngineConfig(block_size=BS, num_draft_tokens=4, adaptive_drafts=False)
    drafting = Drafting(cfg, Fixed(), metrics, scheduler.max_len, lambda: 0.0,
                        cost_aware=False, device_drafts=True)  # fmt: skip
    lane = running_lane(scheduler, max_tokens=3)  # 3 prompt tokens: reaches 6
    lane.output_ids = [5]  # knows 4: room for 6 - 4 - 1 = 1 draft
    assert drafting.num_drafts(lane, 1) == 1
    lane.params = SamplingParams(seed=1, max_tokens=3, draft=False)
    assert drafting.num_drafts(lane, 1) == 0  # "draft": false


def test_a_new_lane_drafts_by_the_engines_running_acceptance():
    """Lanes whose drafts are seldom kept move the engine's running acceptance down, and a lane
    with no verify of its own drafts by it (without it: k 4 again for every new request)."""
    scheduler, _, metrics = parts()
    cfg = EngineConfig(block_size=BS, num_draft_tokens=4)
    drafting = Drafting(cfg, Fixed(), metrics, scheduler.max_len, lambda: 0.0,
                        cost_aware=False, device_drafts=True)  # fmt: skip
    first = running_lane(scheduler, max_tokens=40)
    assert drafting.num_drafts(first, 1) == 4  # nothing measured: the optimistic start
    for _ in range(30):
        drafting.record_verify(first, 4, 0)
    later = make_lane(1, [1, 2, 3], max_tokens=40)
    assert drafting.num_drafts(later, 1) == 1
    assert drafting.acceptance_prior < 0.1
    for _ in range(5):  # then its own verify steps decide
        drafting.record_verify(later, 1, 1)
    assert drafting.num_drafts(later, 1) > 1


def test_adaptive_k_follows_acceptance_and_records_per_position():
    assert [choose_num_drafts(a, 4) for a in (0.0, 0.5, 0.8, 1.0)] == [1, 2, 4, 4]
    lane = make_lane(0, [1])
    record_verify(lane, 3, 1)
    assert (lane.drafted_at, lane.accepted_at, lane.num_verify_steps) == ([1, 1, 1], [1], 1)


# ---- isolation ----------------------------------------------------------------------------


def test_a_stage_failing_for_one_lane_fails_that_lane_alone():
    scheduler, output, _ = parts()
    lanes = [make_lane(i, [1, 2, 3]) for i in range(3)]
    scheduler.waiting.extend(lanes)
    scheduler.admit()
    ran = []

    def stage(steps):
        if any(s.lane.request_id == 1 for s in steps):
            raise RuntimeError("lane 1's fault")
        ran.extend(s.lane.request_id for s in steps)

    ended = isolated(stage, [Step(lane, 0, 3) for lane in lanes], output.fail)
    assert [c.request_id for c in ended] == [1] and ran == [0, 2]
    assert scheduler.running == [lanes[0], lanes[2]]


def test_planning_that_breaks_on_one_lane_fails_it_and_plans_the_rest(monkeypatch):
    import lanes.scheduler

    scheduler, output, _ = parts()
    lanes_ = [make_lane(i, [1, 2, 3]) for i in range(2)]
    scheduler.waiting.extend(lanes_)
    scheduler.admit()
    plan_round = lanes.scheduler.plan_round

    def poisoned(running, *a, **kw):
        if any(lane.request_id == 0 for lane in running):
            raise RuntimeError("lane 0's fault")
        return plan_round(running, *a, **kw)

    monkeypatch.setattr(lanes.scheduler, "plan_round", poisoned)
    plan, failed = plan_isolated(scheduler, no_drafts, output.fail)
    assert [c.request_id for c in failed] == [0]
    assert [s.lane.request_id for s in plan.steps] == [1]


@pytest.mark.parametrize("acceptance", [0.3, 0.9])
def test_record_verify_moves_the_running_acceptance_towards_the_step(acceptance):
    lane = make_lane(0, [1])
    lane.acceptance_ema = acceptance
    record_verify(lane, 4, 4)
    assert lane.acceptance_ema > acceptance
    before = lane.acceptance_ema
    record_verify(lane, 4, 0)
    assert lane.acceptance_ema < before
