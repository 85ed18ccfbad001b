"""Drafting only where it pays (lanes/draft_costs.py): the choice of k from measured costs and
acceptance, and an engine that stops drafting with a drafter that costs more than it saves —
output unchanged either way."""

from __future__ import annotations

import dataclasses
import random
import time

import pytest

from lanes import EngineConfig, SamplingParams, build_engine
from lanes.draft_costs import DraftCosts
from lanes.drafter.replay import ReplayProposer
from tests.test_engine_parts import make_lane


def test_best_k_follows_costs_and_acceptance():
    costs = DraftCosts(forward=10e-3, per_draft=0.0, per_draft_step=1e-3)
    assert costs.best_k(0.9, 4, 1) == 4  # cheap drafts, mostly right: draft them all
    assert costs.best_k(0.05, 4, 1) == 0  # almost never right: drafting only costs
    slow = DraftCosts(forward=10e-3, per_draft=0.0, per_draft_step=12e-3)
    assert slow.best_k(0.9, 4, 1) == 0  # a drafter step dearer than a target step
    # per-draft cost grows with the lanes that verify drafts: more lanes, fewer drafts
    busy = DraftCosts(forward=10e-3, per_draft=0.5e-3, per_draft_step=0.2e-3)
    assert busy.best_k(0.6, 4, 1) > busy.best_k(0.6, 4, 64)


def test_best_k_remembered_below_a_losing_acceptance_is_the_loop_s_answer():
    """best_k skips its loop for an acceptance at or below one that gave 0 with the same costs
    (each k's rate grows with the acceptance): every answer equals a fresh DraftCosts' loop, in
    any order of acceptances, lane counts and cost changes."""
    rng = random.Random(3)
    costs = DraftCosts(forward=2e-3, per_draft=0.05e-3, per_draft_step=0.6e-3)
    for step in range(3000):
        if step % 200 == 199:  # the costs move: what was remembered no longer holds
            costs.record(0, 0, rng.uniform(0.5e-3, 4e-3), 0.0)
        a, k, n = rng.random(), rng.randint(1, 5), rng.choice([1, 4, 16, 64])
        fresh = DraftCosts(costs.forward, costs.per_draft, costs.per_draft_step)
        assert costs.best_k(a, k, n) == fresh.best_k(a, k, n), (step, a, k, n)
    assert costs._pays_not_up_to  # the shortcut was taken
    # negative control: a shortcut that ignored the acceptance would answer 0 where drafts pay
    costs = DraftCosts(forward=2e-3, per_draft=0.0, per_draft_step=0.2e-3)
    assert costs.best_k(0.01, 4, 1) == 0 and costs.best_k(0.95, 4, 1) == 4


def test_record_keeps_running_costs():
    costs = DraftCosts()
    assert not costs.measured
    costs.record(0, 0, 0.010, 0.0)
    costs.record(8, 4, 0.012, 0.004)
    assert costs.measured
    assert costs.forward == pytest.approx(0.010)
    assert costs.per_draft_step == pytest.approx(0.001)
    assert costs.per_draft == pytest.approx(0.00025)


class SlowReplay(ReplayProposer):
    """Replay drafts that take `delay` seconds to propose: a drafter dearer than it is worth."""

    def __init__(self, *args, delay: float) -> None:
        super().__init__(*args)
        self.delay = delay

    def propose(self, lanes, num_drafts, num_branches=None):
        time.sleep(self.delay)
        return super().propose(lanes, num_drafts)


@pytest.fixture(scope="module")
def records(llama_dir):
    engine = build_engine(str(llama_dir))
    rng = random.Random(16)
    prompts = [[rng.randrange(3, 380) for _ in range(n)] for n in (9, 33)]
    params = SamplingParams(max_tokens=80, ignore_eos=True)
    outs = engine.generate(prompts, params)
    return prompts, params, {tuple(p): o.token_ids for p, o in zip(prompts, outs, strict=True)}


def _drafted(llama_dir, records, proposer, cost_aware):
    prompts, params, recorded = records
    config = EngineConfig(cost_aware_drafts=cost_aware)
    engine = build_engine(str(llama_dir), config, proposer=proposer)
    outs = engine.generate(prompts, params)
    assert [o.token_ids for o in outs] == [recorded[tuple(p)] for p in prompts]
    return engine, outs


def test_a_drafter_that_does_not_pay_stops_drafting(llama_dir, records):
    vocab = 384
    _, _, recorded = records
    naive, outs = _drafted(llama_dir, records, SlowReplay(recorded, 0.3, vocab, delay=0.03), False)
    aware, outs2 = _drafted(llama_dir, records, SlowReplay(recorded, 0.3, vocab, delay=0.03), True)
    drafted_naive = sum(o.num_drafted for o in outs)
    drafted_aware = sum(o.num_drafted for o in outs2)
    assert aware.drafting.costs.measured
    assert drafted_aware < drafted_naive / 3  # only the first rounds and the probes draft
    assert drafted_aware > 0


def test_a_drafter_that_pays_keeps_drafting(llama_dir, records):
    _, _, recorded = records
    engine, outs = _drafted(llama_dir, records, ReplayProposer(recorded, 1.0, 384), True)
    steps = sum(o.num_target_steps for o in outs)
    tokens = sum(len(o.token_ids) for o in outs)
    assert engine.drafting.costs.measured
    assert tokens / steps > 3.0  # all but the plain rounds draft the full k of 4, all kept


def test_device_rounds_are_judged_against_a_plain_round():
    """Device rounds draft a fixed k; they go on while tokens per round x a plain round's time
    covers a device round's time, are not judged before DEVICE_SAMPLES rounds, and ask for a
    plain round to be measured when none was."""
    from lanes.draft_costs import DEVICE_SAMPLES, DeviceRoundCosts

    costs = DeviceRoundCosts()
    for _ in range(DEVICE_SAMPLES - 1):
        costs.record(1.0, 2.0)  # one token per 2 ms: worse than 1 ms plain rounds
    assert costs.verdict(forward=1.0) == "go"  # not judged yet
    costs.record(1.0, 2.0)
    assert costs.verdict(forward=None) == "measure"
    assert costs.verdict(forward=1.0) == "pause"
    paying = DeviceRoundCosts()
    for _ in range(DEVICE_SAMPLES):
        paying.record(3.0, 2.0)  # three tokens per 2 ms
    assert paying.verdict(forward=1.0) == "go"
    assert paying.verdict(forward=1.0, stale=True) == "measure"  # plain time measured long ago
    assert paying.verdict(forward=0.5) == "pause"  # plain rounds of 0.5 ms would be faster
    assert paying.verdict(forward=0.62) == "pause"  # 3 x 0.62 ms < 2 ms: no margin
    assert paying.verdict(forward=0.67) == "go"  # 3 x 0.67 ms covers a 2 ms device round


def test_could_pay_is_whether_perfect_acceptance_would():
    assert DraftCosts(forward=10e-3, per_draft=1e-3, per_draft_step=1e-3).could_pay(4, 1)
    # the CPU's exact kernels: a verified draft and a drafter step each near half a forward
    cpu = DraftCosts(forward=9.4e-3, per_draft=4.2e-3, per_draft_step=8.3e-3)
    assert not cpu.could_pay(4, 1) and cpu.best_k(1.0, 4, 1) == 0


class _Probed(ReplayProposer):
    prefilled = 0

    def prefill(self, chunks):
        self.prefilled += len(chunks)


def _lone_lane_drafting(costs, num_rounds, steps):
    """Drafting's choice for a lane that has drafted before, at engine round `num_rounds` and
    the lane's `steps`-th sampling step."""
    from lanes.drafting import Drafting
    from lanes.metrics import EngineMetrics

    metrics = EngineMetrics()
    metrics.num_rounds = num_rounds
    drafting = Drafting(EngineConfig(num_draft_tokens=4), _Probed({}, 1.0, 8), metrics,
                        lambda lane: 10_000, lambda: 0.0, cost_aware=True, device_drafts=False)  # fmt: skip
    drafting.costs = costs
    lane = make_lane(0, [1, 2, 3], max_tokens=100)
    lane.num_verify_steps, lane.acceptance_ema, lane.num_sampling_steps = 3, 0.1, steps
    return drafting, drafting.num_drafts(lane, 1)


def test_lanes_probe_even_where_no_acceptance_would_pay():
    """Probes every 16 engine rounds whatever the costs say: they also re-measure the costs, so
    a transient bad measurement cannot stop drafting for long. Every lane probes in the same
    round, whatever its own step count."""
    from lanes.draft_costs import PROBE_EVERY

    never = DraftCosts(forward=9.4e-3, per_draft=4.2e-3, per_draft_step=8.3e-3)
    for steps in (5, PROBE_EVERY, PROBE_EVERY + 1):
        assert _lone_lane_drafting(never, 2 * PROBE_EVERY, steps)[1] == 1
        assert _lone_lane_drafting(never, 2 * PROBE_EVERY + 1, steps)[1] == 0


def test_probes_are_rarer_where_drafts_are_seldom_kept():
    """Where the engine's running acceptance is low a probe mostly confirms that drafting does
    not pay: every PROBE_EVERY_SELDOM-th round then, and back to every PROBE_EVERY-th once
    drafts are kept again (so a good drafter is not stopped for long by one bad measurement)."""
    from lanes.draft_costs import PROBE_EVERY, PROBE_EVERY_SELDOM

    never = DraftCosts(forward=9.4e-3, per_draft=4.2e-3, per_draft_step=8.3e-3)
    drafting, _ = _lone_lane_drafting(never, 0, 1)
    lane = make_lane(0, [1, 2, 3], max_tokens=100)
    for _ in range(30):
        drafting.record_verify(lane, 1, 0)
    assert drafting.probe_every == PROBE_EVERY_SELDOM
    lane.num_verify_steps, lane.acceptance_ema = 3, 0.1
    drafting.metrics.num_rounds = PROBE_EVERY
    assert drafting.num_drafts(lane, 1) == 0
    drafting.metrics.num_rounds = PROBE_EVERY_SELDOM
    assert drafting.num_drafts(lane, 1) == 1
    for _ in range(30):
        drafting.record_verify(lane, 1, 1)
    drafting.metrics.num_rounds = PROBE_EVERY
    assert drafting.probe_every == PROBE_EVERY
    assert drafting.num_drafts(lane, 1) == 1


def test_a_graphed_round_drafts_evenly():
    """With graph-replayed forwards (even drafts) every drafting lane of a round gets the most
    any lane gets, within its room; a lane with drafts off stays at none. Without, each lane
    keeps its own."""
    from lanes.drafting import Drafting
    from lanes.lane import LaneState
    from lanes.metrics import EngineMetrics

    def drafts(even):
        drafting = Drafting(
            EngineConfig(num_draft_tokens=4), _Probed({}, 1.0, 8), EngineMetrics(),
            lambda lane: 5 if lane.request_id == 2 else 10_000, lambda: 0.0,
            cost_aware=False, device_drafts=False, even_drafts=even,
        )  # fmt: skip
        lanes = [make_lane(i, [1, 2, 3], max_tokens=100) for i in range(4)]
        lanes[3].params = dataclasses.replace(lanes[3].params, draft=False)
        for lane, acceptance in zip(lanes, (0.9, 0.1, 0.9, 0.9), strict=True):
            lane.state = LaneState.DECODE
            lane.num_verify_steps, lane.acceptance_ema = 3, acceptance
        planned = drafting.round_drafts(lanes)
        return [planned(lane, len(lanes)) for lane in lanes]

    assert drafts(even=False) == [4, 1, 1, 0]  # lane 2 has room for one draft
    assert drafts(even=True) == [4, 4, 1, 0]


def test_a_round_where_no_draft_can_pay_answers_as_each_lane_would():
    """round_drafts answers a round where no k pays at its lane count once for all lanes: the
    same answers as asking each lane, in probe rounds, plain-measuring rounds and others, with
    even drafts and without, and where the planner asks at fewer lanes (which may pay)."""
    from lanes.drafting import Drafting
    from lanes.lane import LaneState
    from lanes.metrics import EngineMetrics

    # pays at 1 lane with drafts mostly kept, at no acceptance at 16 lanes
    costs = DraftCosts(forward=1e-3, per_draft=0.5e-3, per_draft_step=0.1e-3)
    assert costs.could_pay(4, 1) and not costs.could_pay(4, 16)
    lanes = [make_lane(i, [1, 2, 3], max_tokens=100) for i in range(16)]
    for i, lane in enumerate(lanes):
        lane.state = LaneState.DECODE
        lane.num_verify_steps, lane.acceptance_ema = 3, (i + 1) / 16
    shortcuts = 0
    for even in (False, True):
        metrics = EngineMetrics()
        drafting = Drafting(
            EngineConfig(num_draft_tokens=4), _Probed({}, 1.0, 8), metrics,
            lambda lane: 10_000, lambda: 0.0, cost_aware=True, device_drafts=False,
            even_drafts=even,
        )  # fmt: skip
        drafting.costs = costs
        for r in range(140):
            metrics.num_rounds = r
            shortcuts += drafting._none_can_pay(16)
            planned = drafting.round_drafts(lanes)
            drafting._none_can_pay = lambda n: False  # the answers without the shortcut
            asked = drafting.round_drafts(lanes)
            del drafting._none_can_pay
            for n in (16, 1):
                assert [planned(x, n) for x in lanes] == [asked(x, n) for x in lanes], (even, r)
        assert drafting.num_drafts(lanes[-1], 1) > 0  # at 1 lane drafts pay
    assert shortcuts > 200  # the shortcut answered most rounds


def test_the_drafter_skips_prompt_chunks_only_while_drafting_cannot_pay():
    from lanes.rounds import Step

    never = DraftCosts(forward=9.4e-3, per_draft=4.2e-3, per_draft_step=8.3e-3)
    could = DraftCosts(forward=10e-3, per_draft=1e-3, per_draft_step=1e-3)
    for costs, lazy, expected in [(never, True, 0), (could, True, 1), (never, False, 1)]:
        drafting, _ = _lone_lane_drafting(costs, 5, 1)
        drafting.lazy_prefill = lazy  # False: device rounds may run, which seed from its rows
        lane = make_lane(1, [1, 2, 3])
        drafting.prefill([Step(lane, 0, 3)])
        assert drafting.proposer.prefilled == expected, (costs, lazy)


def test_a_few_slow_plain_rounds_do_not_price_every_plain_round():
    """At 16 lanes on an H100 device rounds took 2.6 ms for 1.5 tokens per lane against plain
    rounds of about 1.0 ms, yet ran on: the running price of a plain round read 1.9-2.1 ms.
    With the median of recent plain rounds, two slow ones leave the verdict a pause; the
    running average they replaced (negative control) lets the losing rounds go on."""
    from lanes.draft_costs import DeviceRoundCosts, _ema

    samples = [1.0e-3] * 6 + [5.5e-3, 5.0e-3]
    costs = DraftCosts()
    for s in samples:
        costs.record(0, 0, s, 0.0)
    assert costs.forward == pytest.approx(1.0e-3)
    device = DeviceRoundCosts()
    for _ in range(8):
        device.record(1.5, 2.6e-3, 16)
    assert device.verdict(costs.forward) == "pause"
    running = None
    for s in samples:
        running = _ema(running, s)
    assert running > 1.8e-3 and device.verdict(running) == "go"
    # a real change of price is followed within half the window
    for _ in range(5):
        costs.record(0, 0, 2.0e-3, 0.0)
    assert costs.forward == pytest.approx(2.0e-3)


def test_each_pause_at_a_lane_count_makes_its_retries_rarer():
    """Device rounds predicted to lose start again after `retry_every` rounds whatever the
    prediction; each pause at a lane count doubles that, up to DEVICE_RETRY_MAX, and leaves
    other lane counts alone (a retry at 64 lanes cost more than 4,096 rounds could win back).
    A fixed interval, as before, fails the second assertion."""
    from lanes.draft_costs import DEVICE_RETRY, DEVICE_RETRY_MAX, DeviceRoundCosts

    costs = DeviceRoundCosts()
    assert costs.retry_every(64) == DEVICE_RETRY
    costs.paused_at(64)
    assert costs.retry_every(64) == 2 * DEVICE_RETRY and costs.retry_every(4) == DEVICE_RETRY
    for _ in range(40):
        costs.paused_at(64)
    assert costs.retry_every(64) == DEVICE_RETRY_MAX
