"""`lanes distill` and the EAGLE-style drafter it makes.

- toy training: it learns, saves only the drafter's own tensors, loads as a drafter sharing the
  target's embedding, and drafted output equals undrafted (greedy and seeded);
- the serving drafter computes exactly what the training code computes: its drafts are the
  argmax of the trained passes over the same tokens and target features (negative control:
  features one row off give other drafts).
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from lanes import EngineConfig, SamplingParams, build_engine


def test_distill_toy(tiny_models, tmp_path):
    from lanes.drafter.distill import distill

    target, _ = tiny_models["smollm2"]  # tied embeddings, 2 layers
    out = tmp_path / "drafter"
    report = distill(
        str(target),
        out,
        num_prompts=8,
        num_answered=4,
        held_out=2,
        new_tokens=8,
        steps=40,
        batch=4,
        lr=3e-3,
        max_len=64,
        draft_vocab=64,
        snippet_chars=60,
        corpus=("pydoc",),
        everyday=6,
        everyday_file=tmp_path / "everyday.json",
        log=lambda m: None,
    )
    # the tiny model's 256-token context drops the longest chats
    assert 3 <= report["everyday_prompts"] <= 6
    assert report["answered_by_target"] == 4 + report["everyday_prompts"]
    written = json.loads((tmp_path / "everyday.json").read_text())["prompts"]
    assert len(written) == 6 and all(c[-1]["role"] == "user" for c in written)
    losses = report["losses"]
    assert sum(losses[-5:]) < sum(losses[:5])  # it learned something
    saved = json.loads((out / "drafter.json").read_text())
    assert saved["kind"] == "eagle" and saved["shared_with_target"] == ["model.embed_tokens.weight"]
    assert all(v["drafted_equals_undrafted"] for v in saved["held_out"].values())
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert "model.embed_tokens.weight" not in names
    assert {"eagle.fuse.weight", "eagle.vocab", "model.layers.0.mlp.down_proj.weight"} <= names
    for params in (
        SamplingParams(max_tokens=16, ignore_eos=True),
        SamplingParams(max_tokens=16, ignore_eos=True, temperature=0.7, seed=2),
    ):
        plain = build_engine(str(target)).generate(["The quick brown fox"], params)[0]
        drafted = build_engine(str(target), EngineConfig(drafter=str(out))).generate(
            ["The quick brown fox"], params
        )[0]
        assert drafted.token_ids == plain.token_ids and drafted.num_drafted > 0


def _random_head(target_dir, out, vocab_size, layers=None):
    """An untrained drafter (random layer) saved like `lanes distill` saves one; the head
    keeps the bf16-rounded weights the engine will load."""
    from lanes.config import ModelConfig
    from lanes.drafter.distill import EagleHead, hf_config, save
    from lanes.models import open_checkpoint

    target = open_checkpoint(str(target_dir))
    cfg = ModelConfig.from_hf(hf_config(target.config, num_layers=1))
    torch.manual_seed(0)
    head = EagleHead(cfg, target, torch.arange(0, vocab_size, 2), "cpu", layers)
    with torch.no_grad():
        for p in head.params.values():
            p.add_(torch.randn_like(p) * 0.3)
            p.copy_(p.to(torch.bfloat16).float())
    save(head, cfg, out)
    meta = {"kind": "eagle", "target_feature_layers": None if layers is None else list(layers)}
    (out / "drafter.json").write_text(json.dumps(meta))
    return head


@pytest.mark.parametrize("layers", [None, (0, 1)], ids=["final-feature", "two-layers"])
def test_eagle_drafts_match_training_passes(tiny_models, tmp_path, layers):
    target_dir, _ = tiny_models["smollm2"]
    out = tmp_path / "eagle"
    head = _random_head(target_dir, out, 256, layers)
    k = 3
    engine = build_engine(
        str(target_dir),
        EngineConfig(drafter=str(out), num_draft_tokens=k, adaptive_drafts=False),
    )
    seen = []
    propose = engine.proposer.propose

    def recording(lanes, num_drafts):
        drafts = propose(lanes, num_drafts)
        assert len(drafts[0].host_ids()) == num_drafts[0]
        seen.append((lanes[0].all_ids(), drafts[0].host_ids()))
        return drafts

    engine.proposer.propose = recording
    engine.generate(["one two three four"], SamplingParams(max_tokens=12, ignore_eos=True))
    assert len(seen) >= 3
    scorer = build_engine(str(target_dir))
    scorer.runner.decoder.feature_layers = layers  # what the drafter's engine keeps
    assert max(len(d) for _, d in seen) == k
    for known, drafts in seen:
        assert drafts == _training_drafts(head, scorer, known, drafts)
    assert any(
        drafts != _training_drafts(head, scorer, known, drafts, True) for known, drafts in seen
    )


def test_eagle_head_observes_overlapped_rounds(tiny_models, tmp_path):
    """Rounds in which a drafting lane drafts nothing run overlapped (lanes/inflight.py); the
    head still gets the target's features of those rounds, so its later drafts are exactly the
    training passes over the whole text (negative control: without the features carried by
    the in-flight round they are not), and the output equals the undrafted one."""
    target_dir, _ = tiny_models["smollm2"]
    out = tmp_path / "eagle"
    head = _random_head(target_dir, out, 256, (0, 1))
    cfg = EngineConfig(drafter=str(out), num_draft_tokens=3, adaptive_drafts=False, overlap=True)
    engine = build_engine(str(target_dir), cfg)
    engine.drafting.num_drafts = lambda lane, n: (
        3 if lane.num_known % 6 < 2 else 0
    )  # mostly plain rounds
    seen = []
    propose = engine.proposer.propose

    def recording(lanes, num_drafts):
        drafts = propose(lanes, num_drafts)
        seen.append((lanes[0].all_ids(), drafts[0].host_ids()))
        return drafts

    engine.proposer.propose = recording
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    (got,) = engine.generate(["one two three four"], params)
    (plain,) = build_engine(str(target_dir)).generate(
        ["one two three four"], dataclasses.replace(params, draft=False)
    )
    assert got.token_ids == plain.token_ids
    assert engine.metrics.num_overlapped_rounds > 0 and len(seen) >= 2
    scorer = build_engine(str(target_dir))
    scorer.runner.decoder.feature_layers = (0, 1)
    for known, drafts in seen:
        assert drafts == _training_drafts(head, scorer, known, drafts)


def _training_drafts(head, scorer, known, drafts, shift=False):
    """The argmax of the training passes over known + drafts with the target's features of
    `known` (rolled one row with `shift`: the negative control)."""
    ids = known + list(drafts[:-1])
    _, feats = scorer.prompt_logits_and_features([known[:-1]])[0]
    feats = torch.cat([feats, feats.new_zeros(len(ids) - len(feats), feats.shape[1])])
    if shift:
        feats = torch.roll(feats, 1, dims=0)
    with torch.no_grad():
        passes = head.unrolled(torch.tensor([ids]), feats[None], len(drafts))
    n = len(known)
    return tuple(
        int(head.vocab[(g[0, n - 2 + d] @ head.embed[head.vocab].T).argmax()])
        for d, g in enumerate(passes)
    )


def test_hybrid_head_catches_up_after_lookup_rounds(tiny_models, tmp_path):
    """DIR+ngram: rounds drafted by prompt lookup skip the head, which must still see every
    target feature: its next drafts equal the training passes over the whole known text.
    Negative control: without `observe` during the run the head's drafts differ."""
    target_dir, _ = tiny_models["smollm2"]
    out = tmp_path / "eagle"
    head = _random_head(target_dir, out, 256)
    scorer = build_engine(str(target_dir))
    prompt = "a b c d e a b c d e a b c d e one two"
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    plain = scorer.generate([prompt], dataclasses.replace(params, draft=False))[0]

    def run(observe: bool):
        cfg = EngineConfig(drafter=f"{out}+ngram", num_draft_tokens=3, adaptive_drafts=False)
        engine = build_engine(str(target_dir), cfg)
        hybrid, rounds = engine.proposer, []
        if not observe:
            hybrid.observe = lambda *a: None
        for part, name in ((hybrid.head, "head"), (hybrid.lookup, "lookup")):

            def recording(lanes, num_drafts, propose=part.propose, name=name):
                drafts = propose(lanes, num_drafts)
                if drafts[0].num_tokens:
                    rounds.append((name, lanes[0].all_ids(), drafts[0].host_ids()))
                return drafts

            part.propose = recording
        assert engine.generate([prompt], params)[0].token_ids == plain.token_ids
        return rounds

    rounds = run(observe=True)
    names = [name for name, _, _ in rounds]
    after_lookup = [i for i, n in enumerate(names) if n == "head" and "lookup" in names[:i]]
    assert after_lookup, names  # the head drafted after rounds it skipped
    for i in after_lookup:
        _, known, drafts = rounds[i]
        assert drafts == _training_drafts(head, scorer, known, drafts)
    blind = [r for r in run(observe=False) if r[0] == "head"]
    assert any(d != _training_drafts(head, scorer, k, d) for _, k, d in blind)


def test_eagle_drafter_exact_with_cache_hits_and_concurrency(tiny_models, tmp_path):
    """Drafted == undrafted when the drafter misses features (prompt-cache hits) and when
    lanes draft together; the drafter's blocks all come back."""
    target_dir, _ = tiny_models["smollm2"]
    out = tmp_path / "eagle"
    _random_head(target_dir, out, 256)
    prompts = ["a b c d e f g h i j k l m n o p q r s t", "a b c d e f g h i j k l m n o p q x"]
    params = [
        SamplingParams(max_tokens=20, ignore_eos=True),
        SamplingParams(max_tokens=20, ignore_eos=True, temperature=0.8, seed=5),
    ]
    plain = build_engine(str(target_dir)).generate(
        prompts, [dataclasses.replace(p, draft=False) for p in params]
    )
    engine = build_engine(str(target_dir), EngineConfig(drafter=str(out)))
    for _ in range(2):  # the second pass hits the prompt cache
        drafted = engine.generate(prompts, params)
        assert [c.token_ids for c in drafted] == [c.token_ids for c in plain]
        assert sum(c.num_drafted for c in drafted) > 0
    assert drafted[0].cached_tokens > 0
    engine.check_integrity()
    engine.proposer.check_integrity()
    assert not engine.proposer.shadows  # what stays is the drafter's own cache
    assert engine.proposer.pool.num_used == engine.proposer.cache.num_cached > 0


def _record_first_lane_drafts(engine) -> list:
    """From now on, each propose call's drafts of its first lane, appended to the list."""
    calls = []
    propose = engine.proposer.propose

    def recording(lanes, num_drafts):
        drafts = propose(lanes, num_drafts)
        calls.append(drafts[0].host_ids())
        return drafts

    engine.proposer.propose = recording
    return calls


def _drafts_of_two_runs(target_dir, out, drafter_cache: bool, prompt_len: int = 50):
    engine = build_engine(
        str(target_dir), EngineConfig(drafter=str(out), num_draft_tokens=3, adaptive_drafts=False)
    )
    if not drafter_cache:
        engine.proposer.cache.max_blocks = 0  # publishes are declined
    runs, calls = [], _record_first_lane_drafts(engine)
    prompt = list(range(10, 10 + prompt_len))
    for _ in range(2):
        calls.clear()
        out_ = engine.generate([prompt], SamplingParams(max_tokens=12, ignore_eos=True))[0]
        runs.append((list(calls), out_.cached_tokens))
    return runs


def test_eagle_drafter_cache_gives_a_cached_prompt_the_same_drafts(
    tiny_models, tmp_path, monkeypatch
):
    """The second run of a prompt hits the target's prompt cache (no features for those
    positions); the drafter's own cache gives it the same drafts as the first run. Without the
    drafter's cache the target recomputes the prompt for the head (Scheduler._drafter_reach):
    the same drafts, no hit. Negative control: without either, the cached positions read zero
    features and the drafts change."""
    from lanes.scheduler import Scheduler

    target_dir, _ = tiny_models["smollm2"]
    out = tmp_path / "eagle"
    _random_head(target_dir, out, 384)
    (first, fresh_cached), (second, hit_cached) = _drafts_of_two_runs(target_dir, out, True)
    assert fresh_cached == 0 and hit_cached >= 32 and len(first) > 3
    assert second == first
    (first, _), (second, recomputed) = _drafts_of_two_runs(target_dir, out, False)
    assert second == first and recomputed == 0
    with monkeypatch.context() as m:
        m.setattr(Scheduler, "_drafter_reach", lambda self, lane, usable: usable)
        (first, _), (second, _) = _drafts_of_two_runs(target_dir, out, False)
    assert second != first
    # a prompt of whole blocks: the drafter may hold every one of them, and still drafts
    (first, _), (second, hit) = _drafts_of_two_runs(target_dir, out, True, prompt_len=48)
    assert second == first and hit == 32


def test_eagle_dir_for_another_target_is_refused(tiny_models, tmp_path):
    """A drafter made for a target of another width is refused with a message, not a crash."""
    import pytest

    from lanes.config import ConfigError

    target_dir, _ = tiny_models["smollm2"]
    out = tmp_path / "eagle"
    _random_head(target_dir, out, 256)
    cfg = json.loads((out / "config.json").read_text())
    cfg["hidden_size"] *= 2
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="hidden size"):
        build_engine(str(target_dir), EngineConfig(drafter=str(out)))


def test_eagle_drafter_survives_preemption_cancellation_and_a_full_pool(tiny_models, tmp_path):
    """400 rounds of arrivals, cancellations, target preemptions (small KV pool) and a drafter
    pool too small for every lane: blocks never leak, and every request that ran to its end
    equals its undrafted solo run (greedy or seeded)."""
    import random

    target_dir, _ = tiny_models["smollm2"]
    out = tmp_path / "eagle"
    _random_head(target_dir, out, 384)
    rng = random.Random(5)
    prompts = [[rng.randrange(3, 380) for _ in range(rng.randint(3, 40))] for _ in range(10)]
    engine = build_engine(
        str(target_dir),
        EngineConfig(
            drafter=str(out), kv_cache_bytes=2**16, max_lanes=6, draft_kv_cache_bytes=2**15
        ),
    )
    base = build_engine(str(target_dir))
    asked, finished, live = {}, {}, []
    for _ in range(400):
        if rng.random() < 0.25:
            params = SamplingParams(
                max_tokens=rng.randint(1, 40),
                ignore_eos=True,
                temperature=rng.choice([0.0, 0.9]),
                seed=rng.randrange(100),
            )
            prompt = rng.choice(prompts)
            rid = engine.add_request(prompt, params)
            asked[rid] = (prompt, params)
            live.append(rid)
        if live and rng.random() < 0.05:
            engine.cancel(live.pop(rng.randrange(len(live))))
        for c in engine.step():
            if c.request_id in live:
                live.remove(c.request_id)
            if c.finish_reason == "length":
                finished[c.request_id] = c.token_ids
        engine.check_integrity()
        engine.proposer.check_integrity()
    while engine.has_work():
        for c in engine.step():
            if c.finish_reason == "length":
                finished[c.request_id] = c.token_ids
    engine.check_integrity()
    engine.proposer.check_integrity()
    assert not engine.proposer.shadows  # what stays is the drafter's own cache
    assert engine.proposer.pool.num_used == engine.proposer.cache.num_cached
    assert engine.metrics.num_drafted > 100 and len(finished) > 20
    assert engine.metrics.num_preemptions > 0  # the small pool did preempt lanes
    for rid, tokens in finished.items():
        prompt, params = asked[rid]
        assert (
            tokens == base.generate([prompt], dataclasses.replace(params, draft=False))[0].token_ids
        )


def test_answers_file_is_written_then_read_back(tiny_models, tmp_path):
    """Answers made once (say on a CPU box) are reused by a later run instead of regenerated,
    and they are the target's own answers: each greedy answer token is the argmax of the
    serving engine's logits over the same prefix (the teacher is a separate implementation)."""
    from lanes.drafter.corpus import chat_examples, pydoc_texts
    from lanes.drafter.distill import read_answers, teacher_answers
    from lanes.drafter.teacher import DenseTarget
    from lanes.models import open_checkpoint

    target_dir, _ = tiny_models["smollm2"]
    target = open_checkpoint(str(target_dir))
    examples = chat_examples(5, 0, 60, {"pydoc": pydoc_texts()})
    prompts = [target.tokenizer.encode_chat(m) for m, _ in examples]
    path = tmp_path / "answers.jsonl.gz"
    teacher = DenseTarget(target, "cpu", torch.float32)
    made = teacher_answers(teacher, prompts, 6, 0, lambda m: None, answers_file=path, batch=2)
    assert len(read_answers(path)) == 5
    logs = []
    again = teacher_answers(teacher, prompts, 6, 0, logs.append, answers_file=path)
    assert again == made and "(5 read back)" in logs[0] and "0 new tokens" in logs[0]
    scorer = build_engine(checkpoint=target)
    for i in (0, 2, 4):  # the greedy ones (every second answer is sampled)
        n = len(prompts[i])
        assert made[i][:n] == prompts[i] and len(made[i]) > n
        logits = scorer.prompt_logits([made[i][:-1]])[0]
        assert made[i][n:] == logits[n - 1 :].argmax(-1).tolist()


@pytest.mark.slow
def test_shipped_drafter_for_the_default_model():
    """drafter/weights/smollm2-135m-instruct drafts well for the default model and changes no
    output: the head alone keeps more drafts than a blind head (zero features) would, and with
    prompt lookup the drafted text equals the undrafted text, greedy and seeded."""
    from pathlib import Path

    from lanes.drafter.corpus import chat_prompts, pydoc_texts
    from lanes.models.resolve import default_gguf

    shipped = Path(__file__).resolve().parent.parent / "drafter/weights/smollm2-135m-instruct"
    path = str(default_gguf())
    chats = chat_prompts(2, seed=12345, sources={"pydoc": pydoc_texts()})
    cfg = EngineConfig(num_draft_tokens=4, adaptive_drafts=False)

    def tokens_per_verify(engine, params):
        got = engine.generate(chats, params)
        want = engine.generate(chats, [dataclasses.replace(p, draft=False) for p in params])
        assert [g.token_ids for g in got] == [w.token_ids for w in want]
        steps = sum(c.num_target_steps - 1 for c in got)
        return sum(len(c.token_ids) for c in got) / steps

    greedy = [SamplingParams(max_tokens=48)] * 2
    engine = build_engine(path, dataclasses.replace(cfg, drafter=str(shipped)))
    head = tokens_per_verify(engine, greedy)
    assert head > 1.6  # 2.09 on 6 prompts x 128 tokens (bench/results/drafter-acceptance-h200.json)
    engine.proposer.observe = lambda *a: None  # the same engine, its head blind (no features)
    assert tokens_per_verify(engine, greedy) < head - 0.3
    seeded = [SamplingParams(max_tokens=48, temperature=0.7, seed=5 + i) for i in range(2)]
    with_lookup = build_engine(path, dataclasses.replace(cfg, drafter=f"{shipped}+ngram"))
    assert tokens_per_verify(with_lookup, seeded) > 1.4  # n-gram alone: 1.12


def test_a_head_that_skipped_the_prompt_catches_up_exactly(tiny_models, tmp_path):
    """While drafting cannot pay at any acceptance (costs set so), the head skips the prompt's
    chunks; when it next drafts it catches up on every skipped row, and its drafts are still
    exactly the training passes over the whole text."""
    from lanes.draft_costs import DraftCosts

    target_dir, _ = tiny_models["smollm2"]
    out = tmp_path / "eagle"
    head = _random_head(target_dir, out, 256, (0, 1))
    cfg = EngineConfig(drafter=str(out), num_draft_tokens=3, cost_aware_drafts=True)
    engine = build_engine(str(target_dir), cfg)
    engine.drafting.costs = DraftCosts(forward=1.0, per_draft=1.0, per_draft_step=1.0)
    forced = lambda lane, n: 3 if lane.num_known % 5 == 0 else 0  # noqa: E731 (drafts forced)
    engine.drafting.round_drafts = lambda running: forced
    prefilled, seen = [], []
    prefill, propose = engine.proposer.prefill, engine.proposer.propose
    engine.proposer.prefill = lambda chunks: (prefilled.append(len(chunks)), prefill(chunks))

    def recording(lanes, num_drafts):
        drafts = propose(lanes, num_drafts)
        seen.append((lanes[0].all_ids(), drafts[0].host_ids()))
        return drafts

    engine.proposer.propose = recording
    prompt = "one two three four five six seven eight nine ten"
    (got,) = engine.generate([prompt], SamplingParams(max_tokens=16, ignore_eos=True))
    assert not prefilled and len(seen) >= 2
    scorer = build_engine(str(target_dir))
    scorer.runner.decoder.feature_layers = (0, 1)
    for known, drafts in seen:
        assert drafts == _training_drafts(head, scorer, known, drafts)
    (plain,) = scorer.generate([prompt], SamplingParams(max_tokens=16, ignore_eos=True))
    assert got.token_ids == plain.token_ids


def _drafts_after_an_undrafted_run(target_dir, out, first_undrafted: bool):
    """The drafts of a drafted run of one prompt, on an engine that first ran it with
    `draft: false` (or not at all), and that run's cached prompt tokens."""
    engine = build_engine(
        str(target_dir), EngineConfig(drafter=str(out), num_draft_tokens=3, adaptive_drafts=False)
    )
    prompt = list(range(10, 60))
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    if first_undrafted:
        engine.generate([prompt], dataclasses.replace(params, draft=False))
    calls = _record_first_lane_drafts(engine)
    (got,) = engine.generate([prompt], params)
    return calls, got.cached_tokens


def test_a_prompt_cached_by_an_undrafted_request_is_recomputed_for_the_head(
    tiny_models, tmp_path, monkeypatch
):
    """A prompt first sent with `draft: false` is in the target's prompt cache but not the
    head's (the head never ran): a drafted request of it has the target recompute the prompt
    (within a prefill chunk), so the head drafts from real features, as on a fresh engine.
    Negative control: taking the whole cached prefix, the head reads zeros and drafts
    otherwise."""
    from lanes.scheduler import Scheduler

    target_dir, _ = tiny_models["smollm2"]
    out = tmp_path / "eagle"
    _random_head(target_dir, out, 384)
    fresh, _ = _drafts_after_an_undrafted_run(target_dir, out, False)
    after, cached = _drafts_after_an_undrafted_run(target_dir, out, True)
    assert len(fresh) > 3 and after == fresh and cached == 0
    monkeypatch.setattr(Scheduler, "_drafter_reach", lambda self, lane, usable: usable)
    after, cached = _drafts_after_an_undrafted_run(target_dir, out, True)
    assert cached >= 32 and after != fresh


def test_a_drafted_lane_takes_the_whole_hit_where_its_head_would_skip_the_prompt(
    tiny_models, tmp_path
):
    """Where drafting is predicted to lose (here: measured costs no acceptance could beat), the
    head leaves prompt chunks to a later catch-up, so a drafted request takes the target's whole
    prompt-cache hit rather than have the target recompute a prompt for features nobody reads;
    its output equals the undrafted one. Negative control: with costs that can pay, the same
    request has its prompt recomputed (cached 0)."""
    from lanes.draft_costs import DraftCosts

    target_dir, _ = tiny_models["smollm2"]
    out = tmp_path / "eagle"
    _random_head(target_dir, out, 384)
    prompt = list(range(10, 60))
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    cached = {}
    for name, step_seconds in (("lose", 1.0), ("pay", 1e-6)):
        engine = build_engine(
            str(target_dir),
            EngineConfig(drafter=str(out), num_draft_tokens=3, cost_aware_drafts=True),
        )
        (plain,) = engine.generate([prompt], dataclasses.replace(params, draft=False))
        engine.drafting.costs = DraftCosts(forward=1e-3, per_draft=0.0, per_draft_step=step_seconds)
        assert engine.drafting.skips_prompts() == (name == "lose")
        (got,) = engine.generate([prompt], params)
        assert got.token_ids == plain.token_ids
        cached[name] = got.cached_tokens
    assert cached["lose"] >= 32 and cached["pay"] == 0
