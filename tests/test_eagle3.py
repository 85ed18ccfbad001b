"""Published EAGLE-3 heads load as they are (drafter/eagle3_format.py).

Small heads are written in the two layouts users download (the original release's `midlayer.*`
names with `d2t`/`t2d`, and the `speculators` layout with its nested layer config), for a tiny
8-layer Llama with an untied LM head. The reference forward below is written from the format's
description, independently of lanes: the target's residual streams come from transformers'
`output_hidden_states` (index j: the stream entering layer j, vLLM's aux-layer numbering).
Every draft the engine proposes must be the reference's greedy draft over the same tokens;
negative controls break one mechanism each (normed instead of pre-norm target features, the
aux layers one off, `d2t` ignored, the residual started at the wrong place) and must change
some draft. Drafted output equals undrafted, greedy and seeded.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import save_file

from lanes import EngineConfig, SamplingParams, build_engine
from lanes.config import ConfigError
from lanes.models import WeightError
from tests.conftest import write_tiny_model

K = 3
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # device rounds: Triton, native or not
DRAFT_VOCAB = 96
PROMPTS = ["one two three four", "the cat sat on the mat and"]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """An 8-layer tiny Llama (default aux layers 2, 4, 5) and its transformers model."""
    path = tmp_path_factory.mktemp("eagle3") / "llama8"
    model = write_tiny_model(path, "llama", seed=3, num_hidden_layers=8)
    return path, model


def write_head(out, model, layout="original", aux_ids=None, own_embed=False, before=False, seed=0):
    """A random EAGLE-3 head for `model` in a published layout; returns its tensors by role."""
    cfg = model.config
    h, heads, kv, d = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, 16
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=0.25):
        return (torch.randn(*shape, generator=g) * scale).contiguous()

    ids = torch.sort(torch.randperm(cfg.vocab_size, generator=g)[:DRAFT_VOCAB]).values
    n_aux = 3
    t = {
        "q": rand(heads * d, 2 * h),
        "k": rand(kv * d, 2 * h),
        "v": rand(kv * d, 2 * h),
        "o": rand(h, heads * d),
        "gate": rand(128, h),
        "up": rand(128, h),
        "down": rand(h, 128),
        "in_norm": 1 + rand(h, scale=0.1),
        "hidden_norm": 1 + rand(h, scale=0.1),
        "post_norm": 1 + rand(h, scale=0.1),
        "norm": 1 + rand(h, scale=0.1),
        "fc": rand(h, n_aux * h, scale=0.15),
        "lm_head": rand(DRAFT_VOCAB, h, scale=0.5),
        "embed": rand(cfg.vocab_size, h, scale=0.5) if own_embed else None,
        "ids": ids,
    }
    layer = "midlayer." if layout == "original" else "layers.0."
    tensors = {
        layer + "self_attn.q_proj.weight": t["q"],
        layer + "self_attn.k_proj.weight": t["k"],
        layer + "self_attn.v_proj.weight": t["v"],
        layer + "self_attn.o_proj.weight": t["o"],
        layer + "mlp.gate_proj.weight": t["gate"],
        layer + "mlp.up_proj.weight": t["up"],
        layer + "mlp.down_proj.weight": t["down"],
        layer + "input_layernorm.weight": t["in_norm"],
        layer + "hidden_norm.weight": t["hidden_norm"],
        layer + "post_attention_layernorm.weight": t["post_norm"],
        "norm.weight": t["norm"],
        "fc.weight": t["fc"],
        "lm_head.weight": t["lm_head"],
        "d2t": ids - torch.arange(DRAFT_VOCAB),
        "t2d": torch.zeros(cfg.vocab_size, dtype=torch.bool).index_fill_(0, ids, True),
    }
    if own_embed:
        tensors["embed_tokens.weight"] = t["embed"]
    llama = {
        "hidden_size": h,
        "intermediate_size": 128,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": d,
        "num_hidden_layers": 1,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": 10000.0,
        "vocab_size": cfg.vocab_size,
        "model_type": "llama",
    }
    if layout == "original":
        config = {"architectures": ["LlamaForCausalLMEagle3"], **llama}
        config["draft_vocab_size"] = DRAFT_VOCAB
        if aux_ids is not None:
            config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": aux_ids}
    else:
        config = {
            "architectures": ["Eagle3Speculator"],
            "speculators_model_type": "eagle3",
            "transformer_layer_config": llama,
            "draft_vocab_size": DRAFT_VOCAB,
            "norm_before_residual": before,
            "target_hidden_size": h,
            "speculators_config": {"algorithm": "eagle3", "num_speculative_tokens": K},
        }
        if aux_ids is not None:
            config["eagle_aux_hidden_state_layer_ids"] = aux_ids
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(out / "model.safetensors"))
    t["aux_ids"] = sorted(aux_ids or [2, 4, 5])
    t["before"] = before
    return t


def _norm(x, w, eps=1e-5):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rope(x, positions, d):
    inv = 1.0 / 10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = positions[:, None].float() * inv[None]
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    half = d // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos[:, None] + rot * sin[:, None]


def head_forward(t, model, tokens, feats):
    """The head over rows 0..R-1 (row r: token, feature, position r), causal: (logits over the
    draft vocabulary, pre-norm outputs)."""
    cfg = model.config
    embed = t["embed"] if t["embed"] is not None else model.model.embed_tokens.weight
    r, d = len(tokens), 16
    e = _norm(embed[torch.tensor(tokens)], t["in_norm"])
    f = _norm(feats, t["hidden_norm"])
    x = torch.cat([e, f], -1)
    pos = torch.arange(r)
    q = _rope((x @ t["q"].T).view(r, -1, d), pos, d)
    k = _rope((x @ t["k"].T).view(r, -1, d), pos, d)
    v = (x @ t["v"].T).view(r, -1, d)
    group = cfg.num_attention_heads // cfg.num_key_value_heads
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = torch.einsum("qhd,khd->hqk", q, k) / d**0.5
    s = s.masked_fill(torch.ones(r, r, dtype=torch.bool).triu(1), float("-inf"))
    a = torch.einsum("hqk,khd->qhd", s.softmax(-1), v).reshape(r, -1) @ t["o"].T
    h1 = (f if t["before"] else feats) + a
    y = _norm(h1, t["post_norm"])
    h2 = h1 + (torch.nn.functional.silu(y @ t["gate"].T) * (y @ t["up"].T)) @ t["down"].T
    return _norm(h2, t["norm"]) @ t["lm_head"].T, h2


@torch.no_grad()
def reference_drafts(t, model, known, k):
    """Greedy drafts continuing `known`, the head reading the target's aux residual streams."""
    hs = model(torch.tensor([known[:-1]]), output_hidden_states=True).hidden_states
    feats = torch.cat([hs[j][0] for j in t["aux_ids"]], -1) @ t["fc"].T
    tokens = list(known[1:])
    drafts = []
    for _ in range(k):
        logits, pre = head_forward(t, model, tokens, feats)
        draft = int(t["ids"][logits[-1].argmax()])
        drafts.append(draft)
        tokens.append(draft)
        feats = torch.cat([feats, pre[-1:]])
    return tuple(drafts)


def recorded_rounds(target_dir, head_dir, params, break_it=None):
    """(known tokens, drafts) of every drafting round, and the completions."""
    engine = build_engine(
        str(target_dir),
        EngineConfig(drafter=str(head_dir), num_draft_tokens=K, adaptive_drafts=False),
    )
    if break_it is not None:
        break_it(engine)
    seen = []
    propose = engine.proposer.propose

    def recording(lanes, num_drafts):
        drafts = propose(lanes, num_drafts)
        seen.extend((lane.all_ids(), d.host_ids()) for lane, d in zip(lanes, drafts, strict=True))
        return drafts

    engine.proposer.propose = recording
    return seen, engine.generate(PROMPTS, params)


GREEDY = SamplingParams(max_tokens=10, ignore_eos=True)


@pytest.mark.parametrize(
    "layout, kw",
    [
        ("original", {}),
        ("speculators", {"aux_ids": [1, 4, 7], "own_embed": True, "before": True}),
    ],
    ids=["original-release", "speculators"],
)
def test_published_head_drafts_match_the_reference(target, tmp_path, layout, kw):
    target_dir, model = target
    t = write_head(tmp_path / "head", model, layout, **kw)
    seen, got = recorded_rounds(target_dir, tmp_path / "head", GREEDY)
    assert sum(len(d) == K for _, d in seen) >= 4  # fewer where max_tokens is near
    for known, drafts in seen:
        assert drafts == reference_drafts(t, model, known, len(drafts))
    plain = build_engine(str(target_dir)).generate(
        PROMPTS, dataclasses.replace(GREEDY, draft=False)
    )
    assert [c.token_ids for c in got] == [c.token_ids for c in plain]


def _normed_features(engine):
    engine.runner.decoder.feature_prenorm = False


def _aux_layers_one_off(engine):
    engine.runner.decoder.feature_layers = tuple(
        j + 1 for j in engine.runner.decoder.feature_layers
    )


def _d2t_ignored(engine):
    engine.proposer.vocab = torch.arange(DRAFT_VOCAB)


def _residual_from_the_norm(engine):
    engine.proposer.runner.decoder.weights.norm_before_residual = True


@pytest.mark.parametrize(
    "break_it", [_normed_features, _aux_layers_one_off, _d2t_ignored, _residual_from_the_norm]
)
def test_negative_controls_change_the_drafts(target, tmp_path, break_it):
    target_dir, model = target
    t = write_head(tmp_path / "head", model)
    seen, _ = recorded_rounds(target_dir, tmp_path / "head", GREEDY, break_it)
    assert seen
    assert any(drafts != reference_drafts(t, model, known, len(drafts)) for known, drafts in seen)


def test_seeded_sampling_with_a_published_head_equals_undrafted(target, tmp_path):
    target_dir, model = target
    write_head(tmp_path / "head", model)
    params = SamplingParams(max_tokens=12, ignore_eos=True, temperature=0.8, seed=5)
    seen, got = recorded_rounds(target_dir, tmp_path / "head", params)
    plain = build_engine(str(target_dir)).generate(
        PROMPTS, dataclasses.replace(params, draft=False)
    )
    assert seen and [c.token_ids for c in got] == [c.token_ids for c in plain]
    assert sum(c.num_drafted for c in got) > 0


def _rewrite(head, edit_config=None, edit_tensors=None):
    from safetensors.torch import load_file

    if edit_config is not None:
        config = json.loads((head / "config.json").read_text())
        edit_config(config)
        (head / "config.json").write_text(json.dumps(config))
    if edit_tensors is not None:
        tensors = load_file(str(head / "model.safetensors"))
        edit_tensors(tensors)
        save_file(tensors, str(head / "model.safetensors"))


@pytest.mark.parametrize(
    "config_edit, tensor_edit, error, message",
    [
        (lambda c: c.update(vocab_size=999), None, ConfigError, "vocabulary of 999"),
        (lambda c: c.update(num_hidden_layers=2), None, ConfigError, "2 layers"),
        (
            lambda c: c.update(eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 3, 9]}),
            None,
            ConfigError,
            "reads target layers [0, 3, 9]",
        ),  # fmt: skip
        (
            None,
            lambda t: t.update({"fc.weight": t["fc.weight"][:, :64].contiguous()}),
            WeightError,
            "fc.weight has shape [64, 64], expected [64, 192]",
        ),  # fmt: skip
        (
            None,
            lambda t: t.pop("midlayer.hidden_norm.weight"),
            WeightError,
            "missing: model.layers.0.hidden_norm.weight",
        ),  # fmt: skip
        (None, lambda t: t.pop("d2t"), WeightError, "needs 'd2t'"),
        (
            None,
            lambda t: t.update(d2t=torch.zeros(DRAFT_VOCAB, dtype=torch.int64)),
            WeightError,
            "'t2d' and 'd2t'",
        ),  # fmt: skip
    ],
    ids=["vocab", "layers", "aux-ids", "fc-shape", "no-hidden-norm", "no-d2t", "d2t-vs-t2d"],
)
def test_a_head_that_does_not_fit_is_refused_in_one_line(
    target, tmp_path, config_edit, tensor_edit, error, message
):
    target_dir, model = target
    write_head(tmp_path / "head", model)
    _rewrite(tmp_path / "head", config_edit, tensor_edit)
    with pytest.raises(error) as e:
        build_engine(str(target_dir), EngineConfig(drafter=str(tmp_path / "head")))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_vllm_speculative_config_names_an_eagle3_head(target, tmp_path):
    from lanes.serve_options import speculative_options

    target_dir, model = target
    write_head(tmp_path / "head", model)
    spec = json.dumps(
        {"method": "eagle3", "model": str(tmp_path / "head"), "num_speculative_tokens": 4}
    )
    drafter, k = speculative_options(spec)
    assert (drafter, k) == (str(tmp_path / "head"), 4)
    engine = build_engine(str(target_dir), EngineConfig(drafter=drafter, num_draft_tokens=k))
    assert engine.proposer.target_features_prenorm
    assert engine.runner.decoder.feature_layers == (1, 3, 4)  # aux ids 2, 4, 5


def device_round_drafts(target_dir, head_dir, break_it=None):
    """Each device round's drafts [(position of draft 1, drafts)] and the completion."""
    cfg = EngineConfig(
        drafter=str(head_dir), kernels="triton", device=DEVICE, num_draft_tokens=K,
        adaptive_drafts=False, cost_aware_drafts=False, device_rounds=True,
        capture_at_start=False,  # on a GPU: graphs captured after break_it, as it leaves them
    )  # fmt: skip
    engine = build_engine(str(target_dir), cfg)
    if break_it is not None:
        break_it(engine)
    calls = []
    engine.device_rounds.pool = None  # eager rounds on a GPU too: the recording reads the host
    engine.device_rounds.buckets.clear()
    sample = engine.device_rounds.sample

    def recording(logits, positions, p):
        tokens = sample(logits, positions, p)
        calls.append((int(positions[0]), int(tokens[0])))
        return tokens

    engine.device_rounds.sample = recording
    (got,) = engine.generate(PROMPTS[:1], SamplingParams(max_tokens=10, ignore_eos=True))
    assert engine.device_rounds.num_rounds > 0 and len(calls) % K == 0
    rounds = []
    for r in range(0, len(calls), K):
        first = calls[r][0]
        assert [p for p, _ in calls[r : r + K]] == list(range(first, first + K))
        rounds.append((first, tuple(token for _, token in calls[r : r + K])))
    return rounds, got


@pytest.mark.parametrize("broken", [False, True], ids=["head", "negative-control-normed-features"])
def test_a_published_head_in_device_rounds(target, tmp_path, broken):
    """Drafted rounds kept on the device (on the CPU: Triton's interpreter, eagerly) with an
    EAGLE-3 head: the undrafted tokens, and each round's drafts are the reference's greedy drafts
    from where the round stands (the head's catch-up reads pre-norm target features, its later
    steps its own pre-norm output); with normed target features some round's drafts are not."""
    target_dir, model = target
    t = write_head(tmp_path / "head", model)
    rounds, got = device_round_drafts(
        target_dir, tmp_path / "head", _normed_features if broken else None
    )
    params = SamplingParams(max_tokens=10, ignore_eos=True, draft=False)
    undrafted = build_engine(str(target_dir), EngineConfig(kernels="triton", device=DEVICE))
    (plain,) = undrafted.generate(PROMPTS[:1], params)
    assert got.token_ids == plain.token_ids
    text = got.prompt_ids + got.token_ids
    same = [drafts == reference_drafts(t, model, text[:first], K) for first, drafts in rounds]
    assert not all(same) if broken else all(same)


def test_a_repo_id_names_a_cached_head(target, tmp_path, monkeypatch):
    """`--drafter org/name` of an EAGLE-3 head in the Hugging Face cache (offline): its snapshot
    is loaded as the head; the original release's pytorch_model.bin is read as well."""
    from huggingface_hub import constants
    from safetensors.torch import load_file

    target_dir, model = target
    commit = "0" * 40
    snapshot = tmp_path / "hub" / "models--org--eagle3-head" / "snapshots" / commit
    write_head(snapshot, model)
    tensors = load_file(str(snapshot / "model.safetensors"))
    (snapshot / "model.safetensors").unlink()
    torch.save(tensors, snapshot / "pytorch_model.bin")
    refs = tmp_path / "hub" / "models--org--eagle3-head" / "refs"
    refs.mkdir()
    (refs / "main").write_text(commit)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    engine = build_engine(str(target_dir), EngineConfig(drafter="org/eagle3-head"))
    assert engine.proposer.source == str(snapshot)
    assert engine.proposer.target_features_prenorm
    paired = build_engine(str(target_dir), EngineConfig(drafter="org/eagle3-head+ngram"))
    assert paired.proposer.name == "eagle+ngram" and paired.proposer.head.source == str(snapshot)


@torch.no_grad()
def reference_branches(t, model, known, k, width):
    """The head's draft branches continuing `known`: its `width` likeliest first drafts, each
    followed greedily, every branch reading only its own drafts and guesses."""
    hs = model(torch.tensor([known[:-1]]), output_hidden_states=True).hidden_states
    feats = torch.cat([hs[j][0] for j in t["aux_ids"]], -1) @ t["fc"].T
    logits, pre = head_forward(t, model, list(known[1:]), feats)
    firsts = [int(t["ids"][i]) for i in logits[-1].topk(width).indices]
    branches = []
    for first in firsts:
        tokens, branch_feats, drafts = [*known[1:], first], torch.cat([feats, pre[-1:]]), [first]
        for _ in range(k - 1):
            logits_b, pre_b = head_forward(t, model, tokens, branch_feats)
            drafts.append(int(t["ids"][logits_b[-1].argmax()]))
            tokens.append(drafts[-1])
            branch_feats = torch.cat([branch_feats, pre_b[-1:]])
        branches.append(tuple(drafts))
    return branches


def test_head_branches_match_the_reference_and_keep_the_output(target, tmp_path, monkeypatch):
    """--draft-branches 3: the head's branches are its three likeliest first drafts, each
    continued as the reference head continues it; drafted output equals undrafted. Negative
    control: branch rows of the head reading the lane's own rows past the fork."""
    from lanes.runner import ModelRunner

    target_dir, model = target
    t = write_head(tmp_path / "head", model)
    cfg = EngineConfig(
        drafter=str(tmp_path / "head"), num_draft_tokens=K, adaptive_drafts=False, draft_branches=3
    )

    def rounds():
        engine = build_engine(str(target_dir), cfg)
        seen, propose = [], engine.proposer.propose

        def recording(lanes, num_drafts, num_branches=None):
            drafts = propose(lanes, num_drafts, num_branches)
            seen.extend((lane.all_ids(), (d.token_ids, *d.branches)) for lane, d in zip(lanes, drafts, strict=True))  # fmt: skip
            return drafts

        engine.proposer.propose = recording
        return seen, engine.generate(PROMPTS, GREEDY)

    seen, got = rounds()
    assert sum(len(paths) == 3 and len(paths[0]) == K for _, paths in seen) >= 4
    for known, paths in seen:
        want = reference_branches(t, model, known, len(paths[0]), len(paths))
        assert list(paths) == [w[: len(p)] for w, p in zip(want, paths, strict=True)]
    plain = build_engine(str(target_dir)).generate(
        PROMPTS, dataclasses.replace(GREEDY, draft=False)
    )
    assert [c.token_ids for c in got] == [c.token_ids for c in plain]

    monkeypatch.setattr(
        ModelRunner, "_branch_reads", lambda self, r: self.tables.row(r.slot).slots(r.fork, r.end)
    )
    seen, _ = rounds()
    assert any(
        list(paths[1:]) != reference_branches(t, model, known, len(paths[0]), len(paths))[1:]
        for known, paths in seen
    )
