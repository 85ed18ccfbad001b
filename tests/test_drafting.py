"""drafted == "draft": false, for every drafter, greedy and seeded; mixed rounds; negative control."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

import lanes.speculation
from lanes import EngineConfig, SamplingParams, build_engine
from lanes.drafter.model import ModelDrafter
from lanes.drafter.ngram import NgramProposer, ngram_continuation
from lanes.drafter.replay import ReplayProposer
from lanes.models import open_checkpoint
from tests.conftest import write_tiny_model

GREEDY = SamplingParams(max_tokens=40, ignore_eos=True)
SEEDED = SamplingParams(max_tokens=40, ignore_eos=True, temperature=0.7, top_p=0.9, seed=9)
MODES = {"greedy": GREEDY, "seeded": SEEDED}
RNG = random.Random(4)
PROMPTS = [[RNG.randrange(3, 380) for _ in range(n)] for n in (7, 30, 55)]
REPETITIVE = [11, 12, 13, 14, 15, 16] * 6


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("target4") / "llama4"
    write_tiny_model(path, "llama", num_hidden_layers=4)
    return path


@pytest.fixture(scope="module")
def undrafted(target_dir):
    engine = build_engine(str(target_dir))
    prompts = PROMPTS + [REPETITIVE]
    return {
        mode: {tuple(p): engine.generate([p], params, cache_salt="ref")[0] for p in prompts}
        for mode, params in MODES.items()
    }


def _drafters(target_dir, undrafted, mode):
    ckpt = open_checkpoint(str(target_dir))
    cfg = EngineConfig()
    records = {p: c.token_ids for p, c in undrafted[mode].items()}
    vocab = ckpt.config.vocab_size
    return {
        "self": lambda: ModelDrafter(ckpt, ckpt.tokenizer, cfg),
        "truncated-2-layer": lambda: ModelDrafter(ckpt.first_layers(2), ckpt.tokenizer, cfg),
        "ngram": lambda: NgramProposer(min_n=1),  # random weights rarely repeat 2-grams
        "replay-0.0": lambda: ReplayProposer(records, 0.0, vocab),
        "replay-0.5": lambda: ReplayProposer(records, 0.5, vocab),
        "replay-1.0": lambda: ReplayProposer(records, 1.0, vocab),
    }


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize(
    "name", ["self", "truncated-2-layer", "ngram", "replay-0.0", "replay-0.5", "replay-1.0"]
)
def test_drafted_equals_undrafted(target_dir, undrafted, mode, name):
    proposer = _drafters(target_dir, undrafted, mode)[name]()
    engine = build_engine(str(target_dir), EngineConfig(num_draft_tokens=4), proposer=proposer)
    prompts = [REPETITIVE] if name == "ngram" else PROMPTS
    outs = engine.generate(prompts, MODES[mode])
    for p, out in zip(prompts, outs, strict=True):
        ref = undrafted[mode][tuple(p)]
        assert out.token_ids == ref.token_ids
        assert out.logprobs == ref.logprobs
    drafted = sum(o.num_drafted for o in outs)
    accepted = sum(o.num_accepted for o in outs)
    assert drafted > 0
    rate = accepted / drafted
    expected = {"self": (1.0, 1.0), "replay-1.0": (1.0, 1.0), "replay-0.0": (0.0, 0.0)}
    lo, hi = expected.get(name, (0.0, 1.0))
    assert lo <= rate <= hi, rate
    if name == "truncated-2-layer":
        assert rate < 0.6  # a weak drafter: mostly rejected, and still exact
    if name == "replay-0.5":
        assert 0.2 < rate < 0.8
    engine.check_integrity()
    if isinstance(proposer, ModelDrafter):
        proposer.check_integrity()
        assert not proposer.shadows  # every lane's drafter state was released


def test_mixed_rounds_each_equal_solo(target_dir, undrafted):
    ckpt = open_checkpoint(str(target_dir))
    engine = build_engine(
        str(target_dir), proposer=ModelDrafter(ckpt.first_layers(2), ckpt.tokenizer, EngineConfig())
    )
    jobs = [
        (p, dataclasses.replace(SEEDED, draft=i % 2 == 0))
        for i, p in enumerate(PROMPTS + [REPETITIVE])
    ]
    ids = {}
    for p, params in jobs:  # staggered: later prompts prefill while earlier ones decode
        ids[engine.add_request(p, params)] = tuple(p)
        engine.step()
    done = {}
    while engine.has_work():
        done.update((c.request_id, c) for c in engine.step())
    for rid, p in ids.items():
        assert done[rid].token_ids == undrafted["seeded"][p].token_ids
        assert done[rid].logprobs == undrafted["seeded"][p].logprobs
    assert any(c.num_drafted for c in done.values()) and not all(
        c.num_drafted for c in done.values()
    )


def test_negative_control_fresh_randomness_breaks_equality(target_dir, monkeypatch):
    """If the target drew its token with fresh randomness instead of position-keyed noise, the
    drafted run would not equal the undrafted one: the equality test guards the mechanism."""

    def fresh_sample(logits, params, position, seed):
        logprobs = lanes.sampling.sampling_logprobs(logits, params)
        noise = -torch.log(-torch.log(torch.rand(logits.shape[-1]).clamp(1e-9, 1 - 1e-9)))
        return int(torch.argmax(logprobs + noise)), logprobs

    monkeypatch.setattr(lanes.speculation, "sample_row", fresh_sample)
    ckpt = open_checkpoint(str(target_dir))
    plain = build_engine(str(target_dir))
    drafted = build_engine(
        str(target_dir), proposer=ModelDrafter(ckpt, ckpt.tokenizer, EngineConfig())
    )
    torch.manual_seed(0)
    a = plain.generate(PROMPTS, SEEDED)
    torch.manual_seed(0)
    b = drafted.generate(PROMPTS, SEEDED)
    assert [x.token_ids for x in a] != [y.token_ids for y in b]


def test_ngram_continuation_examples():
    import numpy as np

    assert ngram_continuation(np.array([5, 6, 7, 9, 5, 6, 7]), 2, 1, 3) == (9, 5)
    assert ngram_continuation(np.array([1, 2, 3, 4]), 3, 1, 3) == ()
    assert ngram_continuation(np.array([1, 2, 1, 2, 1, 2]), 3, 2, 4) == (1, 2)
    # the latest earlier occurrence wins
    assert ngram_continuation(np.array([4, 8, 1, 4, 9, 4]), 1, 1, 1) == (9,)


def test_drafter_with_other_tokenizer_is_refused(target_dir, tmp_path):
    import json

    from lanes.config import ConfigError

    other = tmp_path / "other"
    write_tiny_model(other, "llama")
    tok = json.loads((other / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[300:302]  # two merged tokens trade ids
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (other / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(ConfigError, match="different ids"):
        build_engine(str(target_dir), EngineConfig(drafter=str(other)))


def test_device_drafts_feed_the_verify_forward(target_dir, undrafted):
    """A drafter that chains its steps on the device leaves its drafts there; the verify forward
    reads them device to device and the host reads them back with the target's samples. The
    self-drafter keeps every draft only if each verify row held the right draft (negative
    control: drafts written one row early into the verify input fail here and above)."""
    ckpt = open_checkpoint(str(target_dir))
    engine = build_engine(
        str(target_dir),
        EngineConfig(num_draft_tokens=4, adaptive_drafts=False),
        proposer=ModelDrafter(ckpt, ckpt.tokenizer, EngineConfig()),
    )
    fill, on_device = engine.drafting.fill, []

    def recording(plan):
        plan = fill(plan)
        on_device.extend(s.draft_source is not None for s in plan.decode)
        return plan

    engine.drafting.fill = recording
    outs = engine.generate(PROMPTS, GREEDY)
    assert on_device and all(on_device)
    for p, out in zip(PROMPTS, outs, strict=True):
        assert out.token_ids == undrafted["greedy"][tuple(p)].token_ids
        assert out.num_accepted == out.num_drafted > 0
