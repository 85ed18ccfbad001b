"""MLX affine 4-bit and 8-bit checkpoints (lanes/models/mlx_affine.py), made by mlx-lm's own
converter from a tiny HF model and checked against mlx-lm's forward on the same quantized weights:
logits close, greedy tokens equal. Negative controls: codes unpacked in the wrong order, scales
and biases swapped."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from lanes import EngineConfig, SamplingParams, build_engine, packed
from lanes.config import ConfigError
from lanes.models.weights import WeightError

mx = pytest.importorskip("mlx.core", reason="mlx is a test dependency (pip install 'mlx[cpu]')")
mlx_lm = pytest.importorskip("mlx_lm", reason="mlx-lm is a test dependency")

PROMPT = "The quick brown fox jumps over the lazy dog. " * 8


@pytest.fixture(scope="module", params=[4, 8], ids=["4bit", "8bit"])
def mlx_dir(request, llama_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"mlx{request.param}") / "model"
    mlx_lm.convert(str(llama_dir), mlx_path=str(out), quantize=True, q_group_size=32,
                   q_bits=request.param)  # fmt: skip
    return out


def _mlx_logits(path, ids: list[int]) -> torch.Tensor:
    model, _ = mlx_lm.load(str(path))
    out = model(mx.array([ids]))[0].astype(mx.float32)
    return torch.from_numpy(np.array(out))


def test_weights_stay_packed_in_memory(mlx_dir, llama_dir):
    config = json.loads((mlx_dir / "config.json").read_text())
    assert config["quantization"]["mode"] == "affine"
    engine = build_engine(str(mlx_dir))
    assert engine.model_config.hidden_size == 64  # the float model's shape, from packed codes
    weights = engine.runner.decoder.weights
    assert isinstance(weights.embed, packed.PackedWeight)
    assert isinstance(weights.layers[0].qkv, packed.PackedWeight)  # q, k, v fused as codes
    float_bytes = build_engine(str(llama_dir)).runner.decoder.weights.nbytes
    bits = config["quantization"]["bits"]
    # codes are bits/32 of fp32; the per-group scales and biases add 2 fp32 per 32 weights
    assert weights.nbytes < float_bytes * (bits / 32 + 2 / 32 + 0.02)


def test_packed_model_is_batch_invariant(mlx_dir):
    engine = build_engine(str(mlx_dir), EngineConfig(max_tokens_per_round=40))
    prompts = [PROMPT, "Paris is the capital of", "def f(x):\n    return x\n" * 3]
    for params in (
        SamplingParams(max_tokens=12, ignore_eos=True),
        SamplingParams(max_tokens=12, ignore_eos=True, temperature=0.8, seed=3),
    ):
        solo = [engine.generate([p], params)[0] for p in prompts]
        batched = engine.generate(prompts, params)
        for s, b in zip(solo, batched, strict=True):
            assert (b.token_ids, b.logprobs) == (s.token_ids, s.logprobs)


def test_logits_and_greedy_tokens_match_mlx_lm(mlx_dir):
    engine = build_engine(str(mlx_dir))
    ids = engine.tokenizer.encode(PROMPT)
    assert len(ids) > 64
    (ours,) = engine.prompt_logits([ids])
    torch.testing.assert_close(ours, _mlx_logits(mlx_dir, ids), rtol=1e-4, atol=1e-4)
    (out,) = engine.generate([ids], SamplingParams(max_tokens=16, ignore_eos=True))
    model, _ = mlx_lm.load(str(mlx_dir))
    seq = list(ids)
    for _ in range(16):  # mlx-lm's greedy continuation, one full forward per token
        seq.append(int(mx.argmax(model(mx.array([seq]))[0, -1]).item()))
    assert out.token_ids == seq[len(ids) :]


@pytest.mark.parametrize("broken", ["codes-reversed", "scales-biases-swapped"])
def test_negative_controls_wrong_unpacking_fails(mlx_dir, monkeypatch, broken):
    right = packed.dequantize

    def wrong(packed, scales, biases, bits, group):
        if broken == "scales-biases-swapped":
            return right(packed, biases, scales, bits, group)
        per_word = 32 // bits  # the codes of each word read most significant first
        codes = right(packed, torch.ones_like(scales), torch.zeros_like(biases), bits, group)
        flipped = codes.reshape(codes.shape[0], -1, per_word).flip(-1).reshape(codes.shape)
        q = flipped.reshape(codes.shape[0], -1, group)
        return (q * scales[..., None] + biases[..., None]).reshape(codes.shape)

    monkeypatch.setattr(packed, "dequantize", wrong)
    engine = build_engine(str(mlx_dir))
    ids = engine.tokenizer.encode(PROMPT)
    (ours,) = engine.prompt_logits([ids])
    assert not torch.allclose(ours, _mlx_logits(mlx_dir, ids), rtol=1e-3, atol=1e-3)


def _edited(mlx_dir, tmp_path, **quantization):
    edited = tmp_path / "edited"
    shutil.copytree(mlx_dir, edited)
    config = json.loads((edited / "config.json").read_text())
    config["quantization"] = {**config["quantization"], **quantization}
    config.pop("quantization_config", None)
    (edited / "config.json").write_text(json.dumps(config))
    return edited


def test_bad_quantization_settings_are_refused(mlx_dir, tmp_path):
    with pytest.raises(ConfigError, match="mode 'mxfp4'"):
        build_engine(str(_edited(mlx_dir, tmp_path, mode="mxfp4")))
    shutil.rmtree(tmp_path / "edited")
    with pytest.raises(ConfigError, match="method 'gptq'"):
        build_engine(str(_edited(mlx_dir, tmp_path, quant_method="gptq")))
    shutil.rmtree(tmp_path / "edited")
    with pytest.raises(ConfigError, match="bits 3"):
        build_engine(str(_edited(mlx_dir, tmp_path, bits=3)))
    shutil.rmtree(tmp_path / "edited")
    # a per-module entry that does not match how the module was packed names the module
    bits = json.loads((mlx_dir / "config.json").read_text())["quantization"]["bits"]
    other = {"model.layers.0.mlp.down_proj": {"bits": 2 if bits != 2 else 4}}
    with pytest.raises(WeightError, match="model.layers.0.mlp.down_proj"):
        build_engine(str(_edited(mlx_dir, tmp_path, **other)))
