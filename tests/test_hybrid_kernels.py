"""Hybrids' recurrent state through the kernels and the CUDA-graph layout, on the CPU: the
state pool's checks, the Triton ops (interpreted here, native on a GPU) keeping the equalities,
and the graph buckets (every lane's state in its pool slot, one launch per layer) giving the
eager path's bits, for Qwen3.5's gated DeltaNet and Nemotron-H's Mamba-2. (Split from
tests/test_hybrid.py so the two files run on different workers.)"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from lanes import EngineConfig, SamplingParams, build_engine
from lanes.cache.state_pool import StatePool
from tests.replay_drafts import drafted_equals_replayed
from tests.test_hybrid import PROMPTS, SEEDED


def test_state_pool_reruns_a_failed_forward_from_its_backup():
    """A forward that fails after some layers wrote their state is run again from the same
    position: read() then gives the state from before that write, and anything else fails."""
    pool = StatePool(2, 1, (3, 2), (2, 2, 2), "cpu")
    slot = pool.allocate()
    pool.write(slot, 0, 4, torch.ones(3, 2), torch.ones(2, 2, 2))
    conv, state = pool.read(slot, 0, 4)
    assert torch.equal(conv, torch.ones(3, 2))
    pool.write(slot, 0, 9, conv * 5, state * 5)  # the forward's write, then it fails
    again, _ = pool.read(slot, 0, 4)  # the rerun
    assert torch.equal(again, torch.ones(3, 2))
    assert torch.equal(pool.read(slot, 0, 9)[0], torch.full((3, 2), 5.0))
    with pytest.raises(AssertionError, match="holds position 9"):
        pool.read(slot, 0, 7)


def test_on_the_triton_ops_the_delta_rule_kernel_keeps_the_equalities(tiny_models):
    """The hybrid through the Triton ops (interpreted on the CPU, native on a GPU), whose
    DeltaNet layers run kernels/delta_rule.py: greedy tokens equal transformers', and prefill
    chunking, batching and drafting (the kept per-row states rolled back) change no bit."""
    engine = triton_ops_keep_the_equalities(*tiny_models["qwen3_5"])
    assert engine.ops.name == "triton" and not engine.ops.chunked_delta


def triton_ops_keep_the_equalities(path, hf, **settings):
    """The checks above for an engine on the Triton ops with `settings`; returns the engine."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    base = dict(kernels="triton", device=device, dtype="float32", **settings)
    engine = build_engine(str(path), EngineConfig(**base))
    ids = engine.tokenizer.encode(PROMPTS[0])
    assert len(ids) > 16  # two prefill chunks below
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    (out,) = engine.generate([ids], params)
    hf.generation_config.eos_token_id = None
    with torch.no_grad():
        ref = hf.generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert out.token_ids == ref[0, len(ids) :].tolist()

    chunked = build_engine(str(path), EngineConfig(**base, prefill_chunk=16))
    (again,) = chunked.generate([ids], params)
    assert (again.token_ids, again.logprobs) == (out.token_ids, out.logprobs)

    prompts = [PROMPTS[1], PROMPTS[3]]
    seeded = dataclasses.replace(SEEDED, max_tokens=6)
    solo = [engine.generate([p], seeded)[0] for p in prompts]
    batched = engine.generate(prompts, seeded)
    for s, b in zip(solo, batched, strict=True):
        assert (b.token_ids, b.logprobs) == (s.token_ids, s.logprobs)

    drafting = build_engine(
        str(path), EngineConfig(**base, num_draft_tokens=3, adaptive_drafts=False)
    )
    drafted_equals_replayed(drafting, prompts, solo, seeded)
    return engine


def _graphed(engine):
    """The engine's target forwards for decode and verify rows through DecodeGraphs' static
    buckets (lanes.graphs), run without capture: the CUDA-graph path's layout, slots named on
    the device, on the CPU."""
    from lanes.graphs import DecodeGraphs

    runner, bs = engine.runner, engine.config.block_size
    positions = runner.num_blocks * bs
    runner.graphs = DecodeGraphs(
        runner.decoder,
        runner.kv,
        runner.tables,
        scratch_slot=positions,
        max_ctx=min(runner.decoder.cfg.max_position_embeddings, positions),
        eager=True,
    )
    return engine


@pytest.mark.parametrize("arch", ["qwen3_5", "nemotron_h"])
def test_graph_buckets_give_the_eager_bits(tiny_models, monkeypatch, arch):
    """Decode and verify rows of a hybrid through the graph buckets (every lane's state read
    and written in its pool slot by one launch per layer; verify rows settled afterwards from
    their saved inputs) give the eager path's tokens and logprobs bitwise: solo, concurrent
    with padding lanes, drafted with rejections. Negative control: without the host's record
    of what a replay did to the slots, the lanes fail. (Nemotron-H: one ssd_scan_lanes launch
    per Mamba-2 layer, its verify rows' (xbc, dt) saved.)"""
    from lanes.graphs import DecodeGraphs

    path, _ = tiny_models[arch]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    base = dict(kernels="triton", device=device, dtype="float32", max_tokens_per_round=40)
    base.update(cuda_graphs=False)  # the reference runs eagerly; _graphed adds the buckets
    params = dataclasses.replace(SEEDED, max_tokens=6)
    prompts = [PROMPTS[1], PROMPTS[3], "Berlin is"]  # short: the interpreter runs every kernel
    eager = build_engine(str(path), EngineConfig(**base))
    want = [eager.generate([p], params)[0] for p in prompts]

    graphed = _graphed(build_engine(str(path), EngineConfig(**base)))
    batched = graphed.generate(prompts, params)  # 3 lanes in the 4-lane bucket
    assert graphed.runner.graphs.num_replays > 0
    for w, b in zip(want, batched, strict=True):
        assert (b.token_ids, b.logprobs) == (w.token_ids, w.logprobs)

    drafting = _graphed(
        build_engine(str(path), EngineConfig(**base, num_draft_tokens=3, adaptive_drafts=False))
    )
    drafted_equals_replayed(drafting, prompts[:2], want[:2], params)  # verify rounds in step
    assert any(t > 1 for _, t in drafting.runner.graphs.graphs)  # verify buckets ran

    monkeypatch.setattr(DecodeGraphs, "_states_after", lambda self, g, steps: None)
    control = _graphed(build_engine(str(path), EngineConfig(**base)))
    assert all(c.finish_reason == "error" for c in control.generate(prompts, params))


def test_state_pool_checks_a_graphed_step_in_place():
    """A graph reads the slot in place, so the pool checks it before the replay: at position 0
    the slot is cleared (a released slot keeps its last lane's values); a layer a failed eager
    forward moved on is put back from its backup; a slot anywhere else fails the step."""
    pool = StatePool(2, 2, (3, 2), (2, 2, 2), "cpu")
    slot = pool.allocate()
    pool.conv[slot].fill_(7.0)
    pool.check_position(slot, 0)
    assert not pool.conv[slot].any() and not pool.recurrent[slot].any()

    for layer in (0, 1):
        pool.write(slot, layer, 4, torch.ones(3, 2), torch.ones(2, 2, 2))
    conv, state = pool.read(slot, 0, 4)  # an eager forward from 4: layer 0 written, then it fails
    pool.write(slot, 0, 9, conv * 5, state * 5)
    pool.check_position(slot, 4)  # a graph reruns the step
    assert pool.positions[slot] == [4, 4]
    assert torch.equal(pool.conv[slot, 0], torch.ones(3, 2))
    pool.advanced(slot, 5)  # the replay moved every layer on
    assert pool.positions[slot] == [5, 5]
    with pytest.raises(AssertionError, match="holds positions"):
        pool.check_position(slot, 4)  # no backup of the state before a replay
    assert pool.num_slots == 2 and pool.scratch_slot == 2  # the scratch slot is no lane's
    pool.check_integrity([slot])
