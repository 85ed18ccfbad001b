"""lanes/mask_budget.py: a lane whose grammar masks are costly rests while it owes mask time, so
the lanes beside it are not held up by its masks; its tokens, and theirs, are unchanged."""

from __future__ import annotations

import time
from dataclasses import dataclass

from lanes import EngineConfig, SamplingParams, build_engine
from lanes.grammar import Grammar
from lanes.mask_budget import MaskBudget


@dataclass
class _Lane:
    request_id: int
    mask_seconds: float = 0.0


def test_a_lane_owing_mask_time_rests_until_others_work_repays_it():
    budget = MaskBudget(share=0.25)
    costly, plain = _Lane(0), _Lane(1)
    lanes = [costly, plain]
    assert budget.runnable(lanes) == lanes
    costly.mask_seconds = 0.100  # 100 ms of masks in a 120 ms round: 20 ms of other work
    budget.end_round(lanes, 0.120)
    assert budget.runnable(lanes) == [plain]  # owes 100 - 0.25 * 20 = 95 ms
    rounds = 1
    while budget.runnable(lanes) == [plain]:
        budget.end_round(lanes, 0.020)  # plain rounds of 20 ms repay 5 ms each
        rounds += 1
    assert rounds == 20  # 95 ms / 5 ms = 19 resting rounds, then it runs again
    assert budget.runnable([costly]) == [costly]  # alone, a lane never rests


def test_cheap_masks_never_make_a_lane_rest():
    budget = MaskBudget(share=0.25)
    lane, other = _Lane(0), _Lane(1)
    for _ in range(50):
        lane.mask_seconds += 0.001  # 1 ms of masks in 20 ms rounds: repaid in the same round
        budget.end_round([lane, other], 0.020)
        assert budget.runnable([lane, other]) == [lane, other]
    assert budget.num_rests == 0


def test_a_costly_grammar_rests_and_every_output_equals_solo(long_model_dir):
    """A grammar lane whose masks are made costly beside a plain lane: it rests in some rounds
    (negative control: with a budget that repays everything at once it never does), and both
    outputs equal their solo runs token for token."""
    engine = build_engine(str(long_model_dir), EngineConfig(prefill_chunk=16))
    plain = SamplingParams(max_tokens=24, ignore_eos=True)
    grammar = SamplingParams(max_tokens=24, grammar=Grammar("regex", "[a-z ]{1,200}"))
    solo = [engine.generate(["plain words"], plain)[0], engine.generate(["hi"], grammar)[0]]

    def slow_allowed(cursor):
        real = cursor.allowed

        def allowed(output_ids):
            time.sleep(0.03)  # as if each mask took 30 ms more than the forward covers
            return real(output_ids)

        return allowed

    for share, rests in ((0.25, True), (1e9, False)):
        budget = engine.mask_budget  # one object, shared by the engine's parts
        budget.share, budget.num_rests = share, 0  # the last loop's lanes ended: no debts left
        lanes = [engine.submit("plain words", plain), engine.submit("hi", grammar)]
        cursor = lanes[1].grammar_cursor
        cursor.allowed = slow_allowed(cursor)
        done = {}
        while engine.has_work():
            for c in engine.step():
                done[c.request_id] = c
        outs = [done[lane.request_id] for lane in lanes]
        assert [o.token_ids for o in outs] == [s.token_ids for s in solo]
        assert (engine.mask_budget.num_rests > 0) == rests, (share, engine.mask_budget.num_rests)
