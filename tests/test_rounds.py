"""The round planner: one rule, block-aligned chunks, decode first, host-managed forwards."""

from __future__ import annotations

from lanes.cache import BlockTable
from lanes.lane import Lane, LaneState
from lanes.rounds import plan_round
from lanes.sampling import SamplingParams


def _lane(rid: int, prompt_len: int, computed: int, state: LaneState, output: int = 0) -> Lane:
    lane = Lane(
        request_id=rid,
        prompt_ids=list(range(prompt_len)),
        params=SamplingParams(seed=0),
        block_table=BlockTable(16),
        detokenizer=None,
        output_ids=list(range(output)),
    )
    lane.num_computed, lane.state = computed, state
    return lane


def test_docstring_example_chunks_end_on_block_boundaries():
    lane = _lane(0, 300, 40, LaneState.FILL)
    plan = plan_round([lane], prefill_budget=100, chunk_tokens=64, block_size=16)
    assert [(s.start, s.end, s.samples) for s in plan.prefill] == [
        (40, 96, False),
        (96, 128, False),
    ]
    assert plan.decode == ()


def test_decode_lanes_first_then_fill_in_order_within_budget():
    d1 = _lane(1, 10, 12, LaneState.DECODE, output=3)  # known 13: one token to compute
    f1 = _lane(2, 20, 0, LaneState.FILL)
    f2 = _lane(3, 50, 0, LaneState.FILL)
    d2 = _lane(4, 5, 6, LaneState.DECODE, output=2)
    plan = plan_round([d1, f1, f2, d2], prefill_budget=40, chunk_tokens=32, block_size=16)
    assert [(s.lane.request_id, s.start, s.end, s.samples) for s in plan.decode] == [
        (1, 12, 13, True),
        (4, 6, 7, True),
    ]
    # f1 finishes its prompt (20 tokens, samples); f2 gets what is left, cut to a block boundary
    assert [(s.lane.request_id, s.start, s.end, s.samples) for s in plan.prefill] == [
        (2, 0, 20, True),
        (3, 0, 16, False),
    ]
    assert plan.num_decode_tokens == 2 and plan.num_prefill_tokens == 36


def test_forwards_carry_decode_with_the_first_chunk():
    d = _lane(1, 10, 10, LaneState.DECODE, output=1)
    f = _lane(2, 200, 0, LaneState.FILL)
    plan = plan_round([d, f], prefill_budget=96, chunk_tokens=32, block_size=16)
    forwards = plan.forwards()
    assert [[(s.lane.request_id, s.start, s.end) for s in g] for g in forwards] == [
        [(1, 10, 11), (2, 0, 32)],
        [(2, 32, 64)],
        [(2, 64, 96)],
    ]


def test_no_budget_means_decode_only_and_waiting_lanes_are_ignored():
    d = _lane(1, 10, 10, LaneState.DECODE, output=1)
    f = _lane(2, 40, 0, LaneState.FILL)
    w = _lane(3, 40, 0, LaneState.WAITING)
    plan = plan_round([d, f, w], prefill_budget=0, chunk_tokens=32, block_size=16)
    assert [s.lane.request_id for s in plan.steps] == [1]


def test_preempted_lane_recomputes_prompt_and_output_then_samples():
    lane = _lane(1, 20, 0, LaneState.FILL, output=5)  # known 25 after preemption
    plan = plan_round([lane], prefill_budget=100, chunk_tokens=64, block_size=16)
    assert [(s.start, s.end, s.samples) for s in plan.prefill] == [(0, 25, True)]
