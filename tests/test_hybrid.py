"""Hybrids — Qwen3.5 (gated DeltaNet + gated attention; lanes/models/deltanet.py) and Nemotron-H
(Mamba-2 + attention + MLP blocks; lanes/models/mamba2.py): against transformers over many
prefill chunks, chunk invariance, the equalities (concurrent == solo,
drafted == undrafted with the recurrent state rolled back, a cancelled request's retry == fresh),
each with a negative control, the vision-language wrapper's text part, refused configurations."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from lanes import EngineConfig, SamplingParams, build_engine
from lanes.cache.state_pool import StatePool
from lanes.config import ConfigError, ModelConfig
from lanes.drafter.replay import ReplayProposer
from lanes.models.decoder import Decoder
from tests.conftest import matches_transformers_over_chunks

PROMPTS = [
    "The quick brown fox jumps over the lazy dog " * 3,
    "Paris is the capital of France; Berlin is",
    "def add(a, b):\n    return a + b\n" * 4,
    "fox",
]
GREEDY = SamplingParams(max_tokens=20, ignore_eos=True)
SEEDED = SamplingParams(max_tokens=20, ignore_eos=True, temperature=0.8, top_p=0.9, seed=7)


@pytest.fixture(scope="module", params=["qwen3_5", "qwen3_5_moe", "nemotron_h"])
def hybrid(tiny_models, request):
    return tiny_models[request.param]


@pytest.fixture(scope="module", params=["qwen3_5", "qwen3_5_moe"])
def qwen_hybrid(tiny_models, request):
    return tiny_models[request.param]


def test_nemotron_h_reads_its_blocks(tiny_models):
    """Each block one mixer with its own norm: Mamba-2 layers hold state slots, the attention
    block alone holds KV, the MLP blocks neither."""
    engine = build_engine(str(tiny_models["nemotron_h"][0]))
    cfg = engine.model_config
    assert cfg.linear_layers == (0, 4) and cfg.attention_layers == (2,)
    assert cfg.mlp_only_layers == (1, 3, 5) and not cfg.attention_rope
    assert engine.runner.kv.k.shape[0] == 1 and engine.recurrent.pool.conv.shape[1] == 2
    layers = engine.runner.decoder.weights.layers
    assert [x.has_mixer for x in layers] == [True, False, True, False, True, False]
    assert [x.has_mlp for x in layers] == [False, True, False, True, False, True]
    assert layers[0].mamba is not None and layers[1].up is not None and layers[2].qkv is not None


def test_config_reads_the_layer_layout(qwen_hybrid):
    engine = build_engine(str(qwen_hybrid[0]))
    cfg = engine.model_config
    assert cfg.linear_layers == (0, 1, 2) and cfg.attention_layers == (3,)
    assert cfg.rope_dim == 4 and cfg.attn_output_gate and cfg.zero_centred_norms
    assert engine.runner.kv.k.shape[0] == 1  # KV only for the attention layer
    assert engine.recurrent.pool.num_slots == engine.config.max_lanes
    layers = engine.runner.decoder.weights.layers
    if cfg.family == "qwen3_5_moe":  # routed experts + the gated shared expert, every layer
        assert cfg.moe_layers == (0, 1, 2, 3) and cfg.norm_topk_prob
        assert all(x.router is not None and x.shared_gate is not None for x in layers)


def test_greedy_tokens_and_logits_match_transformers_over_many_chunks(hybrid):
    path, hf = hybrid
    matches_transformers_over_chunks(path, hf, PROMPTS[0] * 3, 32)


def test_chunk_boundaries_do_not_change_a_bit(hybrid):
    """Prefill in 16-token chunks, 32-token chunks and one forward: the same logprobs, bitwise
    (the recurrence runs position by position on shapes fixed by the model)."""
    ids = build_engine(str(hybrid[0])).tokenizer.encode(PROMPTS[2] * 2)
    seen = []
    for chunk in (16, 32, 512):
        engine = build_engine(str(hybrid[0]), EngineConfig(prefill_chunk=chunk))
        (out,) = engine.generate([ids], SEEDED)
        seen.append((out.token_ids, out.logprobs))
    assert seen[0] == seen[1] == seen[2]


def _solo_and_batched(engine, params):
    solo = [engine.generate([p], params)[0] for p in PROMPTS]
    return solo, engine.generate(PROMPTS, params)


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_concurrent_equals_solo(hybrid, params):
    engine = build_engine(str(hybrid[0]), EngineConfig(max_tokens_per_round=40))
    solo, batched = _solo_and_batched(engine, params)
    for s, b in zip(solo, batched, strict=True):
        assert (b.token_ids, b.logprobs) == (s.token_ids, s.logprobs)  # bitwise
    engine.check_integrity()


def test_negative_control_fast_ops_depend_on_the_batch(hybrid):
    engine = build_engine(str(hybrid[0]), EngineConfig(max_tokens_per_round=40, exact=False))
    solo, batched = _solo_and_batched(engine, GREEDY)
    assert any(s.logprobs != b.logprobs for s, b in zip(solo, batched, strict=True))


def _replayed(engine, params, acceptance):
    """Drafts from a replay of the undrafted output at this acceptance (rejections included)."""
    plain = engine.generate(PROMPTS, dataclasses.replace(params, draft=False))
    records = {tuple(engine.encode(p)): c.token_ids for p, c in zip(PROMPTS, plain, strict=True)}
    engine.proposer = ReplayProposer(records, acceptance, engine.model_config.vocab_size)
    return plain, engine.generate(PROMPTS, params, cache_salt="drafted")


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_drafted_equals_undrafted(hybrid, params):
    """Verify forwards run the drafts through the DeltaNet layers; the state is rolled back to
    the last accepted position (Decoder.settle_states)."""
    engine = build_engine(str(hybrid[0]), EngineConfig(num_draft_tokens=4, adaptive_drafts=False))
    plain, drafted = _replayed(engine, params, 0.5)
    assert sum(d.num_drafted - d.num_accepted for d in drafted) > 0  # drafts were rejected
    for d, p in zip(drafted, plain, strict=True):
        assert (d.token_ids, d.logprobs) == (p.token_ids, p.logprobs)
    engine.check_integrity()


def test_negative_control_without_rollback(hybrid, monkeypatch):
    """Without putting the state back after rejected drafts, the state check fails the lanes;
    with the check off too, the output changes."""
    monkeypatch.setattr(Decoder, "settle_states", lambda self, states, slot, num_computed: None)
    engine = build_engine(str(hybrid[0]), EngineConfig(num_draft_tokens=4, adaptive_drafts=False))
    _, drafted = _replayed(engine, GREEDY, 0.5)
    assert any(d.finish_reason == "error" for d in drafted)

    def unchecked(self, slot, layer, position):  # the slot's state, whatever it has seen
        conv, state = self.conv[slot, layer].clone(), self.recurrent[slot, layer].clone()
        return (conv * 0, state * 0) if position == 0 else (conv, state)

    monkeypatch.setattr(StatePool, "read", unchecked)
    engine = build_engine(str(hybrid[0]), EngineConfig(num_draft_tokens=4, adaptive_drafts=False))
    plain, drafted = _replayed(engine, GREEDY, 0.5)
    assert all(d.finish_reason != "error" for d in drafted)
    assert any(d.token_ids != p.token_ids for d, p in zip(drafted, plain, strict=True))


def test_drafted_equals_undrafted_with_ngram(hybrid):
    engine = build_engine(str(hybrid[0]), EngineConfig(drafter="ngram"))
    drafted = engine.generate(PROMPTS, GREEDY)
    plain = engine.generate(PROMPTS, dataclasses.replace(GREEDY, draft=False))
    assert [(d.token_ids, d.logprobs) for d in drafted] == [
        (p.token_ids, p.logprobs) for p in plain
    ]


def _cancel_after(engine, ids, params, rounds: int) -> int:
    """Submit, run `rounds` engine steps (one 16-token chunk each), cancel; tokens computed."""
    lane = engine.submit(ids, params)
    for _ in range(rounds):
        engine.step()
    computed = lane.num_computed
    assert 0 < computed < len(ids)
    engine.cancel(lane.request_id)
    engine.step()
    assert lane.is_finished
    return computed


def test_cancelled_prefill_resumes_from_its_snapshot(hybrid):
    """cancel_prefill keeps the blocks and the state snapshot of the latest chunk end: an
    identical retry resumes there, repeated cancellations accumulate, and the output equals a
    fresh run's, bitwise."""
    cfg = EngineConfig(prefill_chunk=16, max_tokens_per_round=16)
    ids = build_engine(str(hybrid[0]), cfg).tokenizer.encode(PROMPTS[0] * 4)
    (fresh,) = build_engine(str(hybrid[0]), cfg).generate([ids], SEEDED)
    engine = build_engine(str(hybrid[0]), cfg)
    first = _cancel_after(engine, ids, SEEDED, 3)
    assert engine.cached_prefix_len(ids) == first
    second = _cancel_after(engine, ids, SEEDED, 2)  # resumed at `first`, then 2 more chunks
    assert engine.cached_prefix_len(ids) == second > first
    (retry,) = engine.generate([ids], SEEDED)
    assert retry.cached_tokens == second
    assert (retry.token_ids, retry.logprobs) == (fresh.token_ids, fresh.logprobs)
    assert engine.recurrent.snapshots.num_restored == 2
    engine.check_integrity()


def test_a_shared_prefix_resumes_where_a_snapshot_is(hybrid):
    """A second prompt sharing a first one's opening resumes at the last snapshot inside the
    shared blocks (a chunk end), not at the last shared block."""
    cfg = EngineConfig(prefill_chunk=32, max_tokens_per_round=32)
    engine = build_engine(str(hybrid[0]), cfg)
    base = engine.tokenizer.encode(PROMPTS[0] * 4)
    other = base[:56] + engine.tokenizer.encode(PROMPTS[1])
    engine.generate([base], GREEDY)
    (resumed,) = engine.generate([other], GREEDY)
    assert resumed.cached_tokens == 32  # blocks 0-2 are shared; the snapshot is at 32
    (fresh,) = build_engine(str(hybrid[0]), cfg).generate([other], GREEDY)
    assert (resumed.token_ids, resumed.logprobs) == (fresh.token_ids, fresh.logprobs)


@pytest.mark.parametrize("overlap", [False, True], ids=["synchronous", "overlapped"])
def test_a_next_turn_resumes_inside_the_previous_answer(hybrid, overlap):
    """A follow-up prompt (the first prompt, its answer, a new message) resumes at the answer's
    last block boundary, where the lane kept an output snapshot — only the latest one per lane
    — and its output equals a fresh engine's, bitwise. With overlapped rounds too, where the
    next round is launched before the last one's tokens are taken (and its snapshot copied)."""
    cfg = EngineConfig(prefill_chunk=32, max_tokens_per_round=32, overlap=overlap)
    engine = build_engine(str(hybrid[0]), cfg)
    first = engine.tokenizer.encode(PROMPTS[1])
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    (answer,) = engine.generate([first], params)
    assert (engine.metrics.num_overlapped_rounds > 10) == overlap  # the mechanism ran
    # 13 prompt tokens (no aligned chunk end), 40 answered: of the output's boundaries 16, 32
    # and 48 only the latest is kept
    assert len(first) == 13 and len(engine.recurrent.snapshots) == 1
    turn = first + answer.token_ids + engine.tokenizer.encode(PROMPTS[3])
    reached = (len(first) + len(answer.token_ids) - 1) // 16 * 16  # the last boundary computed
    (resumed,) = engine.generate([turn], GREEDY)
    assert resumed.cached_tokens == reached > len(first)
    (fresh,) = build_engine(str(hybrid[0]), cfg).generate([turn], GREEDY)
    assert (resumed.token_ids, resumed.logprobs) == (fresh.token_ids, fresh.logprobs)
    engine.check_integrity()


def _next_turn_resumed_and_fresh(model_dir, overlap: bool):
    """The next-turn scenario of the test above, for its negative controls: (the follow-up
    resumed inside the first answer, the follow-up on a fresh engine)."""
    cfg = EngineConfig(prefill_chunk=32, max_tokens_per_round=32, overlap=overlap)
    engine = build_engine(str(model_dir), cfg)
    first = engine.tokenizer.encode(PROMPTS[1])
    (answer,) = engine.generate([first], SamplingParams(max_tokens=40, ignore_eos=True))
    turn = first + answer.token_ids + engine.tokenizer.encode(PROMPTS[3])
    (resumed,) = engine.generate([turn], GREEDY)
    assert resumed.cached_tokens > len(first)
    (fresh,) = build_engine(str(model_dir), cfg).generate([turn], GREEDY)
    return resumed, fresh


def test_negative_control_overlapped_rounds_past_a_snapshot(hybrid, monkeypatch):
    """With a round launched on top of one that ends on a block boundary, the snapshot copied
    when that one's tokens are taken holds a later state: the next turn differs from fresh."""
    from lanes.overlap import Overlap

    monkeypatch.setattr(Overlap, "_snapshot_due", lambda self, steps: False)
    resumed, fresh = _next_turn_resumed_and_fresh(hybrid[0], overlap=True)
    assert resumed.logprobs != fresh.logprobs  # (Nemotron-H's tiny model keeps its tokens)


def test_negative_control_an_output_snapshot_keyed_one_block_early(hybrid, monkeypatch):
    """Output snapshots filed under the previous block's key (the state 16 tokens later than the
    key says): the next turn resumes there and its output changes, so the test above is not
    vacuous."""
    from lanes.recurrent import RecurrentStates

    original = RecurrentStates.after_prefill

    def keyed_early(self, lane, position=None):
        n, bs = lane.num_computed, self.block_size
        if position is None and n > len(lane.prompt_ids) and n % bs == 0 and n >= 2 * bs:
            key = lane.block_keys[n // bs - 2]
            self.snapshots.discard(key)
            self.snapshots.put(key, *self.pool.snapshot(lane.state_slot))
            return
        original(self, lane, position)

    monkeypatch.setattr(RecurrentStates, "after_prefill", keyed_early)
    resumed, fresh = _next_turn_resumed_and_fresh(hybrid[0], overlap=False)
    assert resumed.logprobs != fresh.logprobs


def test_negative_control_a_snapshot_one_block_off(hybrid, monkeypatch):
    """Resuming from the snapshot one block before the matched prefix's end (as if it were the
    state there) changes the output: the resume test above is not vacuous."""
    from lanes.recurrent import RecurrentStates

    def one_off(self, lane, num_blocks):
        lane.state_slot = self.pool.allocate()
        if num_blocks:
            earlier = self.snapshots.get(lane.block_keys[max(0, num_blocks - 2)])
            self.pool.restore(lane.state_slot, *earlier, num_blocks * self.block_size)

    cfg = EngineConfig(prefill_chunk=16, max_tokens_per_round=16)
    ids = build_engine(str(hybrid[0]), cfg).tokenizer.encode(PROMPTS[0] * 4)
    (fresh,) = build_engine(str(hybrid[0]), cfg).generate([ids], SEEDED)
    monkeypatch.setattr(RecurrentStates, "admit", one_off)
    engine = build_engine(str(hybrid[0]), cfg)
    _cancel_after(engine, ids, SEEDED, 3)
    (retry,) = engine.generate([ids], SEEDED)
    assert retry.cached_tokens > 0
    assert retry.logprobs != fresh.logprobs


def test_vision_language_wrapper_serves_its_text_part(qwen_hybrid, tmp_path):
    """Qwen3_5ForConditionalGeneration checkpoints: text_config, model.language_model.* keys, a
    vision tower that is skipped. Same logits as the text model, bitwise."""
    path, _ = qwen_hybrid
    text_cfg = json.loads((path / "config.json").read_text())
    tensors = load_file(str(path / "model.safetensors"))
    wrapped = {k.replace("model.", "model.language_model.", 1): v for k, v in tensors.items()}
    wrapped["model.visual.patch_embed.proj.weight"] = torch.zeros(8, 3)
    out = tmp_path / "vl"
    out.mkdir()
    save_file(wrapped, str(out / "model.safetensors"))
    wrapper = text_cfg["architectures"][0].replace("ForCausalLM", "ForConditionalGeneration")
    config = {
        "architectures": [wrapper],
        "model_type": "qwen3_5",
        "text_config": {**text_cfg, "architectures": None},
        "vision_config": {"depth": 1},
    }
    (out / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (out / name).write_text((path / name).read_text())
    ids = list(range(3, 60))
    (want,) = build_engine(str(path)).prompt_logits([ids])
    (got,) = build_engine(str(out)).prompt_logits([ids])
    assert torch.equal(got, want)


def test_unsupported_hybrid_configs_are_refused(qwen_hybrid):
    base = json.loads((qwen_hybrid[0] / "config.json").read_text())
    assert ModelConfig.from_hf(base).is_hybrid
    bad = {
        "layer_types": [
            "linear_attention",
            "sliding_attention",
            "linear_attention",
            "full_attention",
        ],
        "linear_num_value_heads": 3,
        "hidden_act": "gelu",
        "linear_conv_kernel_dim": 0,
    }
    for field, value in bad.items():
        with pytest.raises(ConfigError, match=field):
            ModelConfig.from_hf({**base, field: value})
    with pytest.raises(ConfigError, match="text_config"):
        ModelConfig.from_hf({"architectures": ["Qwen3_5ForConditionalGeneration"]})


def test_nemotron_h_configs_as_hub_checkpoints_write_them_and_refusals(tiny_models):
    """The older hub form (hybrid_override_pattern, num_hidden_layers, an infinite dt bound
    written as JSON's Infinity) reads as transformers 5's layers_block_type does; MoE blocks and
    the variants lanes does not run are refused, each naming its field."""
    base = json.loads((tiny_models["nemotron_h"][0] / "config.json").read_text())
    want = ModelConfig.from_hf(base)
    hub = {k: v for k, v in base.items() if k != "layers_block_type"}
    hub.update(hybrid_override_pattern="M-*-M-", num_hidden_layers=6)
    hub["time_step_limit"] = json.loads("[0.0, Infinity]")
    assert ModelConfig.from_hf(hub) == want
    with pytest.raises(ConfigError, match="MoE blocks"):
        ModelConfig.from_hf({**hub, "hybrid_override_pattern": "M-*E"})
    bad = {
        "mlp_hidden_act": "gelu",
        "mamba_hidden_act": "relu",
        "use_bias": True,
        "mlp_bias": True,
        "conv_kernel": 1,
        "n_groups": 3,
        "time_step_limit": [0.0],
    }
    for field, value in bad.items():
        with pytest.raises(ConfigError, match=field):
            ModelConfig.from_hf({**base, field: value})
    with pytest.raises(ConfigError, match="unknown"):
        ModelConfig.from_hf({**base, "layers_block_type": ["mamba", "sliding"]})


def test_server_disconnect_mid_prefill_then_retry_resumes(tmp_path_factory):
    """Through the server: a client that disconnects mid-prefill of a hybrid model leaves its
    progress (blocks + state snapshot); the retry resumes there and equals a fresh request."""
    import asyncio
    import random
    import time

    from tests.conftest import write_tiny_model
    from tests.live_server import MODEL, LiveServer

    path = tmp_path_factory.mktemp("hybrid-long") / "qwen3_5"
    write_tiny_model(path, "qwen3_5", max_position_embeddings=2048)
    engine = build_engine(str(path), EngineConfig(prefill_chunk=16, max_tokens_per_round=16))
    long_prompt = [random.Random(3).randrange(3, 380) for _ in range(1500)]
    kw = dict(model=MODEL, prompt=long_prompt, max_tokens=8, temperature=0)
    with LiveServer(engine, report_cached_tokens=True) as server:

        async def disconnect_early():
            client = server.async_client()
            stream = await client.completions.create(
                **kw, stream=True, extra_body={"ignore_eos": True}
            )
            await asyncio.sleep(0.3)  # 1,500 tokens in 16-token chunks take longer
            await stream.close()
            await client.close()

        asyncio.run(disconnect_early())
        deadline = time.time() + 60
        while server.kv()["active_lanes"] and time.time() < deadline:
            time.sleep(0.05)
        kv = server.kv()
        assert kv["integrity"] == "ok" and kv["state_slots_used"] == 0 and kv["state_snapshots"] > 0
        metrics = server.get("/metrics")
        assert f"lanes_state_slots_capacity {float(kv['state_slots_capacity'])}" in metrics
        assert f"lanes_state_snapshot_bytes {float(kv['state_snapshot_bytes'])}" in metrics
        client = server.client()
        retry = client.completions.create(**kw, extra_body={"ignore_eos": True})
        fresh = client.completions.create(
            **kw, extra_body={"ignore_eos": True, "cache_salt": "fresh"}
        )
    assert 0 < retry.usage.prompt_tokens_details.cached_tokens < len(long_prompt) - 100
    assert fresh.usage.prompt_tokens_details.cached_tokens == 0
    assert retry.choices[0].text == fresh.choices[0].text


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_on_the_gpu_concurrent_equals_solo_and_drafted_equals_undrafted(hybrid, params):
    """The hybrid path on CUDA (Triton linears, attention and delta rule; decode and verify
    forwards as CUDA graphs): the same equalities, bitwise, and the eager path's bits."""
    cfg = EngineConfig(device="cuda", num_draft_tokens=4, adaptive_drafts=False)
    engine = build_engine(str(hybrid[0]), cfg)
    solo, batched = _solo_and_batched(engine, params)
    assert engine.runner.graphs is not None and engine.runner.graphs.num_replays > 0
    assert all(len(c.token_ids) == params.max_tokens for c in solo + batched)  # none failed
    for s, b in zip(solo, batched, strict=True):
        assert (b.token_ids, b.logprobs) == (s.token_ids, s.logprobs)
    eager = build_engine(str(hybrid[0]), cfg.replace(cuda_graphs=False))
    for s, e in zip(solo, _solo_and_batched(eager, params)[1], strict=True):
        assert (e.token_ids, e.logprobs) == (s.token_ids, s.logprobs)
    plain, drafted = _replayed(engine, params, 0.5)
    assert sum(d.num_drafted - d.num_accepted for d in drafted) > 0
    for d, p in zip(drafted, plain, strict=True):
        assert (d.token_ids, d.logprobs) == (p.token_ids, p.logprobs)
    engine.check_integrity()


def test_a_model_drafter_drafts_for_a_hybrid_target(hybrid, tiny_models):
    """An attention-only drafter model (same tokenizer) proposes for a hybrid target; the
    output is the target's own."""
    llama_dir, _ = tiny_models["llama"]
    cfg = EngineConfig(drafter=str(llama_dir), num_draft_tokens=3, adaptive_drafts=False)
    engine = build_engine(str(hybrid[0]), cfg)
    drafted = engine.generate(PROMPTS, SEEDED)
    plain = engine.generate(PROMPTS, dataclasses.replace(SEEDED, draft=False))
    assert sum(d.num_drafted for d in drafted) > 0
    for d, p in zip(drafted, plain, strict=True):
        assert (d.token_ids, d.logprobs) == (p.token_ids, p.logprobs)
    engine.check_integrity()
