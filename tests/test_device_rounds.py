"""Drafted rounds kept on the device (lanes/device_rounds.py) emit exactly the undrafted tokens
and logprobs, greedy and seeded, alone and batched, overlapped or not; on the CPU the same ops run eagerly
on Triton's interpreter, on the GPU as one CUDA graph per round."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from lanes import EngineConfig, SamplingParams, build_engine
from lanes.device_rounds import DeviceRounds
from tests.test_distill import _random_head

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FIXED_K = dict(num_draft_tokens=3, adaptive_drafts=False, cost_aware_drafts=False)
PROMPTS = ["one two three four five", "a b c d e f g h i j k l m n o p", "the the the the"]


def make_head_dir(tiny_models, tmp_path_factory) -> tuple:
    """The tiny SmolLM2 target and a random EAGLE head for it (both files' module fixtures)."""
    target_dir, _ = tiny_models["smollm2"]
    out = tmp_path_factory.mktemp("head") / "eagle"
    _random_head(target_dir, out, 256)
    return target_dir, out


@pytest.fixture(scope="module")
def head_dir(tiny_models, tmp_path_factory):
    return make_head_dir(tiny_models, tmp_path_factory)


class Oracle:
    """The head's sampler replaced by one that knows the undrafted output: each draft is right
    except at some positions (pos * 5 % 11 < 3), so rounds keep every count of drafts from 0 to
    k and the positions of the next round move by each of them. Runs eagerly (it reads the
    positions on the host)."""

    def __init__(self, rounds: DeviceRounds, plain: dict[tuple, list[int]]) -> None:
        self.rounds, self.plain = rounds, plain
        rounds.pool = None  # eager rounds, on the GPU too
        rounds.buckets.clear()  # those captured at start replay the head's own sampler
        self.kept: set[int] = set()
        take = rounds.take

        def recording():
            results = take()
            self.kept.update(r.accepted for r in results)
            return results

        rounds.take = recording

    def __call__(self, logits: torch.Tensor, positions: torch.Tensor, params) -> torch.Tensor:
        out = positions.tolist()
        for i, pos in enumerate(out):
            lane = self.rounds.lanes[i] if i < len(self.rounds.lanes) else None
            right = 0
            if lane is not None:
                tokens = self.plain[tuple(lane.prompt_ids)]
                at = pos - len(lane.prompt_ids)
                right = tokens[at] if 0 <= at < len(tokens) else 0
            out[i] = right if pos * 5 % 11 >= 3 else (right + 1) % 256
        return torch.tensor(out, dtype=torch.int64, device=logits.device)


def _engine(head_dir, **kw):
    target_dir, out = head_dir
    cfg = dict(device=DEVICE, kernels="triton", drafter=str(out), **FIXED_K) | kw
    return build_engine(str(target_dir), EngineConfig(**cfg))


PARAMS = SamplingParams(max_tokens=16, ignore_eos=True)
# seeded lanes ride the same rounds: every row sampled with its lane's parameters and noise
SEEDED = dataclasses.replace(PARAMS, temperature=0.8, top_k=40, top_p=0.9, seed=21)


def _plain(head_dir, params):
    engine = _engine(head_dir, device_rounds=False)
    done = engine.generate(PROMPTS, dataclasses.replace(params, draft=False))
    return {tuple(c.prompt_ids): c for c in done}


@pytest.fixture(scope="module")
def plain(head_dir):
    return _plain(head_dir, PARAMS)


@pytest.fixture(scope="module")
def plain_seeded(head_dir):
    return _plain(head_dir, SEEDED)


def _with_oracle(engine, plain) -> Oracle:
    oracle = Oracle(engine.device_rounds, {k: c.token_ids for k, c in plain.items()})
    engine.device_rounds.sample = oracle
    return oracle


@pytest.mark.parametrize("overlap", [False, True], ids=["in-turn", "overlapped"])
def test_device_rounds_emit_the_undrafted_tokens(head_dir, plain, overlap):
    """Tokens and logprobs equal draft: false's, over rounds that kept 0 .. k drafts; with
    overlap, a lane whose stop token is read one round late ends at it while the others go
    on (its extra round is dropped)."""
    engine = _engine(head_dir, device_rounds=True, overlap=overlap)
    assert isinstance(engine.device_rounds, DeviceRounds)
    oracle = _with_oracle(engine, plain)
    want = [plain[tuple(engine.encode(p))] for p in PROMPTS]
    params = [PARAMS] * len(PROMPTS)
    if overlap:
        stop = want[0].token_ids[8]
        params[0] = dataclasses.replace(PARAMS, stop_token_ids=[stop])
    got = engine.generate(PROMPTS, params)
    assert engine.device_rounds.num_rounds > 0
    assert oracle.kept == set(range(engine.device_rounds.k + 1))
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        n = w.token_ids.index(stop) + 1 if overlap and i == 0 else len(w.token_ids)
        assert g.token_ids == w.token_ids[:n]
        assert g.logprobs == w.logprobs[:n]
    if overlap:
        assert got[0].finish_reason == "stop"
    engine.check_integrity()
    engine.proposer.check_integrity()


def test_seeded_device_rounds_emit_the_undrafted_tokens(head_dir, plain_seeded):
    """Seeded lanes (temperature, top-k, top-p): the verify samples each row with the lane's
    noise at its own position, and the tokens and logprobs are draft: false's."""
    engine = _engine(head_dir, device_rounds=True, overlap=True)
    oracle = _with_oracle(engine, plain_seeded)
    got = engine.generate(PROMPTS, SEEDED)
    assert engine.device_rounds.num_rounds > 0
    assert oracle.kept == set(range(engine.device_rounds.k + 1))
    for g in got:
        want = plain_seeded[tuple(g.prompt_ids)]
        assert (g.token_ids, g.logprobs) == (want.token_ids, want.logprobs)
    engine.check_integrity()


def test_negative_control_seeded_rounds_at_the_rows_own_positions_fail(
    head_dir, plain_seeded, monkeypatch
):
    """The verify's rows sampled with the noise of the position they read instead of the one
    their token will stand at: the seeded output is no longer the undrafted one."""
    import lanes.device_rounds
    from lanes.kernels.sampling import sample_with

    monkeypatch.setattr(
        lanes.device_rounds,
        "sample_with",
        lambda logits, params, positions, per=1: sample_with(logits, params, positions - 1, per),
    )
    engine = _engine(head_dir, device_rounds=True)
    _with_oracle(engine, plain_seeded)
    # two lanes and 8 tokens: the first verified drafts already take the wrong noise
    got = engine.generate(PROMPTS[:2], dataclasses.replace(SEEDED, max_tokens=8))
    assert engine.device_rounds.num_rounds > 0
    want = [plain_seeded[tuple(g.prompt_ids)].token_ids[:8] for g in got]
    assert [g.token_ids for g in got] != want


def test_the_head_itself_in_device_rounds(head_dir, plain):
    """The head's own drafts (catch-up on the verify's features, drafts chained on its rows),
    batched with padding lanes: the undrafted tokens."""
    engine = _engine(head_dir, device_rounds=True)
    got = engine.generate(PROMPTS[:3], dataclasses.replace(PARAMS, max_tokens=10))
    assert engine.device_rounds.num_rounds > 0
    for g in got:
        assert g.token_ids == plain[tuple(g.prompt_ids)].token_ids[:10]
    engine.proposer.check_integrity()


def test_the_head_itself_in_seeded_device_rounds(head_dir, plain_seeded):
    """The head samples its own drafts with each lane's noise; the target's tokens are the
    undrafted ones whatever it proposes."""
    engine = _engine(head_dir, device_rounds=True)
    got = engine.generate(PROMPTS, dataclasses.replace(SEEDED, max_tokens=10))
    assert engine.device_rounds.num_rounds > 0
    for g in got:
        assert g.token_ids == plain_seeded[tuple(g.prompt_ids)].token_ids[:10]
    engine.proposer.check_integrity()


def test_negative_control_rounds_that_forget_the_accepted_count_fail(head_dir, plain, monkeypatch):
    """Without the accepted count carried on the device (each round assumes no draft was kept),
    the output is no longer the undrafted one."""
    real = DeviceRounds._round

    def forgetful(self, b):
        real(self, b)
        b.a.zero_()

    monkeypatch.setattr(DeviceRounds, "_round", forgetful)
    engine = _engine(head_dir, device_rounds=True)
    _with_oracle(engine, plain)
    got = engine.generate(PROMPTS, PARAMS)
    assert [g.token_ids for g in got] != [plain[tuple(g.prompt_ids)].token_ids for g in got]


def test_lanes_come_and_go_mid_rounds(head_dir, plain):
    """A cancel and a new request while rounds are in flight: the rounds end (the in-flight one
    taken), the lanes go on host-managed and start device rounds again; every output is still
    the undrafted one (the cancelled lane's, up to where it stopped)."""
    engine = _engine(head_dir, device_rounds=True, overlap=True)
    _with_oracle(engine, plain)
    dr = engine.device_rounds
    a, b = (engine.submit(p, PARAMS) for p in PROMPTS[:2])
    done = {}
    while dr.num_rounds < 2:
        done |= {c.request_id: c for c in engine.step()}
    engine.cancel(a.request_id)
    c = engine.submit(PROMPTS[2], PARAMS)
    while engine.has_work():
        done |= {x.request_id: x for x in engine.step()}
    assert done[a.request_id].finish_reason == "cancelled"
    cut = done[a.request_id].token_ids
    assert cut == plain[tuple(a.prompt_ids)].token_ids[: len(cut)]
    for lane in (b, c):
        assert done[lane.request_id].token_ids == plain[tuple(lane.prompt_ids)].token_ids
    assert dr.num_rounds > 2  # rounds started again after the change
    engine.check_integrity()
    engine.proposer.check_integrity()


def test_a_failing_launch_leaves_rounds_host_managed(head_dir, plain, monkeypatch):
    """A device round that cannot be launched is logged, device rounds turn off, and the
    request is served by host-managed rounds with the same output."""

    def broken(self):
        raise RuntimeError("injected")

    monkeypatch.setattr(DeviceRounds, "launch", broken)
    engine = _engine(head_dir, device_rounds=True)
    (got,) = engine.generate(PROMPTS[1:2], dataclasses.replace(PARAMS, max_tokens=10))
    assert engine.device_rounds is None
    assert got.token_ids == plain[tuple(got.prompt_ids)].token_ids[:10]


def test_device_rounds_that_do_not_pay_pause(head_dir, plain, monkeypatch):
    """With cost-aware drafts, device rounds judged slower than plain rounds stop for
    DEVICE_PAUSE rounds while the same requests run; the request goes on in plain rounds (no
    host-managed drafts for a lane device rounds could carry), with the same output."""
    from lanes.draft_costs import DeviceRoundCosts

    monkeypatch.setattr(
        DeviceRoundCosts,
        "verdict",
        lambda self, forward, stale=False: "pause" if self.samples >= 2 else "go",
    )
    monkeypatch.setattr(DeviceRoundCosts, "predicts_loss", lambda self, *a: False)
    engine = _engine(head_dir, device_rounds=True, cost_aware_drafts=True, adaptive_drafts=True)
    (got,) = engine.generate(PROMPTS[1:2], dataclasses.replace(PARAMS, max_tokens=12))
    assert got.token_ids == plain[tuple(got.prompt_ids)].token_ids[:12]
    assert 2 <= engine.device_rounds.num_rounds <= 3
    assert engine.device_driver.paused_until > engine.metrics.num_rounds
    # verify steps: one per device round's lane, none host-managed after the pause
    assert engine.metrics.num_verify_steps == engine.device_rounds.num_rounds
    # a new request is judged afresh: device rounds start for it although the pause is on
    before = engine.device_rounds.num_rounds
    engine.generate(PROMPTS[1:2], dataclasses.replace(PARAMS, max_tokens=6))
    assert engine.device_rounds.num_rounds > before


def test_device_rounds_predicted_to_lose_do_not_start(head_dir, plain, monkeypatch):
    """Where the lanes' acceptance predicts a clear loss at this lane count (their measured
    round seconds), device rounds do not start, the lane is not drafted host-managed either,
    and the head does not compute its prompt: plain rounds, the same output. Negative control:
    without the prediction they start, from the head's prefilled rows."""
    from lanes import draft_costs

    def run(predicts):
        monkeypatch.setattr(
            draft_costs.DeviceRoundCosts, "predicts_loss", lambda self, *a: predicts
        )
        engine = _engine(head_dir, device_rounds=True, cost_aware_drafts=True, adaptive_drafts=True)
        head = engine.drafting.proposer
        chunks = []
        monkeypatch.setattr(
            head, "prefill", lambda c, real=head.prefill: chunks.extend(c) or real(c)
        )
        (got,) = engine.generate(PROMPTS[1:2], dataclasses.replace(PARAMS, max_tokens=10))
        assert got.token_ids == plain[tuple(got.prompt_ids)].token_ids[:10]
        return engine, chunks

    skipped, chunks = run(True)
    assert skipped.device_rounds.num_rounds == 0
    assert skipped.metrics.num_verify_steps == 0  # nor host-managed drafts
    assert not chunks  # nor the head's prompt
    assert not skipped.device_driver.due()  # no lane running (once: a mean over no lanes raised)
    started, chunks = run(False)
    assert started.device_rounds.num_rounds > 0 and chunks


def test_a_head_that_skipped_the_prompt_catches_up_for_device_rounds(head_dir, plain, monkeypatch):
    """A prompt prefilled while device rounds predicted a loss, then a prediction that they pay
    (say, fewer lanes): the head catches up on the skipped prompt in a host-managed round and
    device rounds start from its rows; the output equals `draft: false`."""
    from lanes import draft_costs

    calls = []  # predicted a loss for the prefill and the first decode rounds only
    monkeypatch.setattr(
        draft_costs.DeviceRoundCosts,
        "predicts_loss",
        lambda self, *a: len(calls.append(0) or calls) < 4,
    )
    engine = _engine(head_dir, device_rounds=True, cost_aware_drafts=True, adaptive_drafts=True)
    head = engine.drafting.proposer
    chunks = []
    monkeypatch.setattr(head, "prefill", lambda c, real=head.prefill: chunks.extend(c) or real(c))
    (got,) = engine.generate(PROMPTS[1:2], dataclasses.replace(PARAMS, max_tokens=12))
    assert got.token_ids == plain[tuple(got.prompt_ids)].token_ids[:12]
    assert not chunks  # the prompt was skipped
    assert engine.device_rounds.num_rounds > 0  # and caught up on: device rounds seeded


def test_device_round_costs_predict_a_loss_by_lane_count():
    """A device round's seconds are kept by lane count across starts; a start is skipped only
    where (1 + k * acceptance) plain rounds' time clearly falls short of one."""
    from lanes.draft_costs import DEVICE_CLEAR, DeviceRoundCosts

    costs = DeviceRoundCosts()
    assert not costs.predicts_loss(16, 0.0, 4, 1.0)  # nothing measured at 16 lanes
    costs.record(1.5, 2.6, num_lanes=16)
    costs.restart()
    assert costs.round_seconds == {16: 2.6}  # kept across starts
    forward, k = 0.9, 4
    low = (2.6 / (forward * DEVICE_CLEAR) - 1) / k  # the acceptance where it turns
    assert costs.predicts_loss(16, low - 0.01, k, forward)
    assert not costs.predicts_loss(16, low + 0.01, k, forward)
    assert not costs.predicts_loss(4, 0.0, k, forward)  # another lane count: not measured
    assert not costs.predicts_loss(16, 0.0, k, None)  # no plain round measured


def test_device_round_drafts_are_the_heads_training_passes(head_dir, plain, tmp_path):
    """What the head drafts in a device round is what its training passes give over the lane's
    text and the target's features: rounds keep 0 .. k drafts (the oracle's), so the catch-up
    reads the verify's rows at every kept count and the drafts chain on the head's own rows.
    Output equality cannot see this (a wrong draft is only rejected); a head fed the wrong
    rows would keep fewer drafts than it was trained to. Negative control: the same passes
    over features one row off give other drafts."""
    from tests.test_distill import _random_head, _training_drafts

    target_dir, _ = head_dir
    head = _random_head(target_dir, tmp_path / "eagle", 256)  # the fixture's head (seed 0)
    engine = _engine((target_dir, tmp_path / "eagle"), device_rounds=True)
    dr = engine.device_rounds
    own_sample = dr.sample
    oracle = _with_oracle(engine, plain)
    calls = []  # per head sample: the lanes, draft positions, the head's own and the oracle's

    def recording(logits, positions, params):
        out = oracle(logits, positions, params)
        own = own_sample(logits, positions, params)
        calls.append((list(dr.lanes), positions.tolist(), own.tolist(), out.tolist()))
        return out

    dr.sample = recording
    engine.generate(PROMPTS[:2], dataclasses.replace(PARAMS, max_tokens=12))
    k = dr.k
    assert calls and len(calls) % k == 0 and oracle.kept == set(range(k + 1))
    scorer = build_engine(str(target_dir))
    checked, shifted_differ = 0, False
    for r in range(0, len(calls), k):
        lanes = calls[r][0]
        for i, lane in enumerate(lanes):
            text = list(lane.prompt_ids) + plain[tuple(lane.prompt_ids)].token_ids
            first = calls[r][1][i]  # where draft 1 stands: the lane knows the tokens before it
            if first > len(text):
                continue  # a round past the lane's end
            drafts = tuple(calls[r + m][3][i] for m in range(k))
            own = tuple(calls[r + m][2][i] for m in range(k))
            assert own == _training_drafts(head, scorer, text[:first], drafts), (r, i)
            shifted = _training_drafts(head, scorer, text[:first], drafts, True)
            shifted_differ |= own != shifted
            checked += 1
    assert checked >= 4 and shifted_differ
