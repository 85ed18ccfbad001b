"""`lanes distill` at toy scale: it trains, saves only the drafter's own tensors, loads as a
drafter that shares the target's embedding, and drafted output equals undrafted."""

from __future__ import annotations

import json

from lanes import Engine, EngineConfig, SamplingParams


def test_distill_toy(tiny_models, tmp_path):
    from drafter.distill import distill

    target, _ = tiny_models["smollm2"]  # tied embeddings, 2 layers
    out = tmp_path / "drafter"
    report = distill(
        str(target),
        out,
        layers=(1,),
        num_prompts=6,
        new_tokens=6,
        steps=12,
        batch=2,
        snippet_chars=60,
        log=lambda m: None,
    )
    assert report["losses"][-1] < report["losses"][0]  # it learned something
    saved = json.loads((out / "drafter.json").read_text())
    assert saved["shared_with_target"] == ["model.embed_tokens.weight"]
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert (
        "model.embed_tokens.weight" not in names and "model.layers.0.mlp.down_proj.weight" in names
    )
    params = SamplingParams(max_tokens=16, ignore_eos=True, temperature=0.7, seed=2)
    plain = Engine(str(target)).generate(["The quick brown fox"], params)[0]
    drafted = Engine(str(target), EngineConfig(drafter=str(out))).generate(
        ["The quick brown fox"], params
    )[0]
    assert drafted.token_ids == plain.token_ids and drafted.num_drafted > 0
