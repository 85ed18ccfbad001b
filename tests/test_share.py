"""The share allocator: converges to the target share; on the engine, a higher share gets prompts
out sooner and slows decode. Time comes from fake clocks, so these tests do not time anything."""

from __future__ import annotations

import itertools
import random
import statistics

import pytest

from lanes import EngineConfig, SamplingParams, build_engine
from lanes.prompt_burst import PromptBurst
from lanes.share import MAX_SKIP, ShareAllocator

# (overhead, per prefill token, per decode token) in seconds; every target reachable with the
# 16-token blocks, MAX_SKIP and the 16384-token cap. The last: prompt tokens dear beside few
# decode rows, as on the CPU, where a block every round was most of the time (0.68 achieved
# for a 0.30 target on the dev box) and the rounds now owe blocks instead.
COSTS = [(3e-3, 5e-5, 5e-4), (1e-3, 1e-5, 1e-3), (5e-4, 5e-6, 2e-4), (1e-3, 2e-4, 2e-4)]


@pytest.mark.parametrize("share", [0.1, 0.3, 0.5, 0.7, 0.9])
@pytest.mark.parametrize("costs", COSTS)
def test_achieved_share_converges(share, costs):
    a, b, c = costs
    if costs == COSTS[3] and share not in (0.3, 0.5):
        # 0.1: below a block every MAX_SKIP rounds; 0.7, 0.9: one or two blocks a round, where
        # whole blocks set the share (plan_round cuts prompt steps at block boundaries)
        pytest.skip("at these costs blocks, not the allocator, decide the share")
    rng = random.Random(7)
    alloc = ShareAllocator(share, min_prefill=16, max_tokens=16384)
    prefill_time = total = 0.0
    without = 0  # rounds in a row without prompt work
    for r in range(200):
        decode = rng.randint(1, 4 if costs == COSTS[3] else 32)  # lanes come and go
        prefill = alloc.prefill_budget(decode, prompts_waiting=True)
        without = 0 if prefill else without + 1
        assert without < MAX_SKIP and (prefill == 0 or prefill >= 16)  # no prompt starves
        noise = 1 + rng.uniform(-0.05, 0.05)
        seconds = (a + b * prefill + c * decode) * noise
        alloc.record(prefill, decode, seconds)
        if r >= 100:
            prefill_time += b * prefill * noise
            total += seconds
    assert abs(prefill_time / total - share) <= 0.05
    assert abs(alloc.achieved_share - share) <= 0.05  # what the metrics report


def test_only_one_kind_waiting():
    alloc = ShareAllocator(0.3, min_prefill=16, max_tokens=512)
    assert alloc.prefill_budget(decode_tokens=0, prompts_waiting=True) == 512
    assert alloc.prefill_budget(decode_tokens=8, prompts_waiting=False) == 0
    assert 16 <= alloc.prefill_budget(decode_tokens=8, prompts_waiting=True) <= 504


def test_a_dear_block_is_owed_not_taken_every_round():
    """Negative control for the CPU case above: a block every round overshoots the share."""
    a, b, c = COSTS[3]
    alloc = ShareAllocator(0.3, min_prefill=16, max_tokens=512)
    rounds = []
    for _ in range(200):
        prefill = alloc.prefill_budget(2, prompts_waiting=True)
        alloc.record(prefill, 2, a + b * prefill + c * 2)
        rounds.append(prefill)
    assert 0 in rounds[100:] and abs(alloc.achieved_share - 0.3) <= 0.05
    every_round = b * 16 / (a + b * 16 + c * 2)  # what the old floor gave
    assert every_round > 0.6


class FakeClock:
    """Advances only when the model runs, by a fixed cost per forward."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _engine_with_fake_time(llama_dir, share, bursts=True):
    clock = FakeClock()
    engine = build_engine(
        str(llama_dir),
        EngineConfig(
            prefill_share=share, prefill_chunk=32, max_tokens_per_round=512, prefill_bursts=bursts
        ),
        clock=clock,
    )
    real = engine.runner.execute

    def timed(steps, all_logits=False):
        tokens = sum(s.num_tokens for s in steps)
        clock.now += 2e-3 + 1e-4 * tokens  # overhead + per token
        return real(steps, all_logits)

    engine.runner.execute = timed
    return engine


def _ttft_and_itl(llama_dir, share, bursts=True):
    """Four lanes decode; a 200-token prompt arrives. Its TTFT, and the decode lanes' mean
    inter-token latency while it was being filled."""
    engine = _engine_with_fake_time(llama_dir, share, bursts)
    decoders = [
        engine.add_request([5 + i, 6, 7], SamplingParams(max_tokens=200, ignore_eos=True))
        for i in range(4)
    ]
    for _ in range(5):
        engine.step()
    long_id = engine.add_request(list(range(3, 203)), SamplingParams(max_tokens=2, ignore_eos=True))
    lanes = {lane.request_id: lane for lane in engine.running + engine.waiting}
    while not lanes[long_id].token_times:
        engine.step()
    arrival, first = lanes[long_id].arrival_time, lanes[long_id].token_times[0]
    gaps = [
        t2 - t1
        for rid in decoders
        for t1, t2 in itertools.pairwise(lanes[rid].token_times)
        if arrival <= t1 and t2 <= first
    ]
    return first - arrival, statistics.mean(gaps)


def test_higher_share_lowers_ttft_and_raises_itl(llama_dir):
    ttft_low, itl_low = _ttft_and_itl(llama_dir, 0.1)
    ttft_high, itl_high = _ttft_and_itl(llama_dir, 0.9)
    assert ttft_high < ttft_low
    assert itl_high > itl_low


def test_whole_round_ignores_the_share():
    alloc = ShareAllocator(0.1, min_prefill=16, max_tokens=512)
    assert alloc.prefill_budget(decode_tokens=8, prompts_waiting=True, whole_round=True) == 504
    assert alloc.prefill_budget(decode_tokens=8, prompts_waiting=False, whole_round=True) == 0


def test_a_burst_lasts_until_its_prompts_are_computed():
    burst = PromptBurst()
    assert burst.active({1, 2, 3}, num_decode=0)
    assert burst.active({2, 3}, num_decode=1)  # 1 decodes now; 2 and 3 still wait
    assert burst.active({3, 4, 5, 6}, num_decode=2)  # 4-6 arrived meanwhile: not members
    assert burst.active({4, 5, 6}, num_decode=3)  # 3 is done; 4-6 are a burst of their own
    assert not burst.active(set(), num_decode=6)


def test_one_prompt_among_decoding_lanes_is_no_burst():
    burst = PromptBurst()
    assert not burst.active({9}, num_decode=4)
    assert burst.active({9, 10, 11, 12}, num_decode=4)  # as many waiting as decoding
    assert not PromptBurst(enabled=False).active({1, 2, 3}, num_decode=1)


def _arrive_together(llama_dir, share, bursts, n=8, prompt_len=200):
    """n requests arrive at once: (their mean TTFT, the fake seconds until all are done,
    their token ids)."""
    engine = _engine_with_fake_time(llama_dir, share, bursts)
    params = SamplingParams(max_tokens=32, ignore_eos=True)
    ids = [engine.add_request(list(range(3 + i, 3 + i + prompt_len)), params) for i in range(n)]
    lanes = {lane.request_id: lane for lane in engine.running + engine.waiting}
    done = {}
    while engine.has_work():
        done.update((c.request_id, c.token_ids) for c in engine.step())
    ttft = statistics.mean(lanes[i].token_times[0] - lanes[i].arrival_time for i in ids)
    return ttft, engine.clock(), [done[i] for i in ids]


def test_requests_arriving_together_are_computed_first(llama_dir):
    """At a low share, a burst runs like share 1.0 (the negative control: without bursts the
    share spreads the prompts over mixed rounds, and every first token comes later)."""
    ttft_on, total_on, tokens_on = _arrive_together(llama_dir, 0.1, bursts=True)
    ttft_off, total_off, tokens_off = _arrive_together(llama_dir, 0.1, bursts=False)
    ttft_full, total_full, tokens_full = _arrive_together(llama_dir, 1.0, bursts=False)
    assert tokens_on == tokens_off == tokens_full  # where a chunk lands changes no token
    assert ttft_on == pytest.approx(ttft_full) and total_on == pytest.approx(total_full)
    assert ttft_off > 1.15 * ttft_on


def test_a_long_prompt_among_decoders_keeps_the_share(llama_dir):
    """Bursts leave the case the share is for alone: one prompt among four decoding lanes."""
    assert _ttft_and_itl(llama_dir, 0.1) == _ttft_and_itl(llama_dir, 0.1, bursts=False)


def test_a_slow_first_prompt_round_does_not_bend_the_fit():
    """The CPU case: the decoders' first prompt round (120 tokens, nothing decoding) ran slow,
    so an unconstrained fit wants a negative overhead. Holding it at its floor and refitting
    keeps decode rounds predicted near their time; clamping after the solve (the negative
    control, computed here) predicted them at 7x."""
    import numpy as np

    from lanes.share import CostModel

    model = CostModel()
    rows = [(120, 0, 0.67)] + [(0, 3, 0.022)] * 20 + [(16, 3, 0.13)] * 10
    for p, d, s in rows:
        model.observe(p, d, s)
    assert model.predict(0, 3) == pytest.approx(0.022, rel=0.3)  # 0.028: the slow row pulls
    assert model.predict(16, 3) == pytest.approx(0.13, rel=0.25)
    x = np.array([(1.0, p, d) for p, d, _ in rows])
    clamped = np.maximum(np.linalg.lstsq(x, np.array([r[2] for r in rows]), rcond=None)[0], 0)
    assert clamped @ (1, 0, 3) > 5 * 0.022  # 0.162


def test_rounds_that_captured_or_compiled_do_not_set_the_budget():
    """The H100 case (issue 42): the first prompt rounds after an engine's build ran seconds
    long (captures, compiles), then decode rounds of 63 lanes at 7.7 ms and prompt rounds at
    their real cost. Left out of the fit, the stalls do not set the budget: a 32K prompt among
    the decoders gets the tokens its costs ask for at share 0.5 (about 140), not the round's
    whole room. The negative control: the plain least-squares fit of the same rounds (computed
    here) puts the stalls in the overhead and asks for thousands of tokens."""
    import numpy as np

    a, b, c = 2e-3, 6e-5, 9e-5  # the H100's 8B costs, roughly
    rows = [(1024, 0, 2.9), (8192, 0, 1.6)]  # stalled: first use of their shapes
    rows += [(8192, 0, a + b * 8192)] * 4 + [(128 * 63, 0, a + b * 8064)]
    rng = random.Random(3)
    rows += [(0, 63, (a + c * 63) * rng.uniform(0.97, 1.03)) for _ in range(40)]
    alloc = ShareAllocator(0.5, min_prefill=16, max_tokens=8192)
    for p, d, s in rows:
        alloc.record(p, d, s)
    want = (a + c * 63) / b  # the budget the true costs give at share 0.5: 128 tokens
    budgets = [alloc.prefill_budget(63, prompts_waiting=True) for _ in range(20)]
    assert 0.5 * want < statistics.median(budgets) < 1.6 * want
    x = np.array([(1.0, p, d) for p, d, _ in rows])
    plain = np.linalg.lstsq(x, np.array([r[2] for r in rows]), rcond=None)[0]
    assert (plain[0] + plain[2] * 63) / max(plain[1], 1e-9) > 10 * want
