"""MLX 4-bit MoE checkpoints as `mlx_lm.convert -q` writes them (the experts stacked under
`mlp.switch_mlp`, Qwen3-MoE's router at 8 bits): lanes reads each expert's slice and matches
mlx-lm's own forward on the same quantized weights (logits close, greedy tokens equal), for
Qwen3-MoE and GLM-4 MoE. Negative control: experts read in the wrong order."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from lanes import SamplingParams, build_engine

mx = pytest.importorskip("mlx.core", reason="mlx is a test dependency (pip install 'mlx[cpu]')")
mlx_lm = pytest.importorskip("mlx_lm", reason="mlx-lm is a test dependency")

PROMPT = "The quick brown fox jumps over the lazy dog. " * 6


@pytest.fixture(scope="module", params=["qwen3_moe", "glm4_moe"])
def mlx_moe(request, tiny_models, tmp_path_factory):
    src = tmp_path_factory.mktemp(request.param) / "hf"
    shutil.copytree(tiny_models[request.param][0], src)
    cfg = json.loads((src / "config.json").read_text())
    # mlx-lm 0.32 reads the names transformers 4 wrote; transformers 5 nests or renames them
    rope = cfg.get("rope_parameters") or {}
    cfg.setdefault("rope_theta", rope.get("rope_theta", 10000.0))
    cfg.setdefault("rope_scaling", None)
    cfg.setdefault("partial_rotary_factor", rope.get("partial_rotary_factor", 0.5))
    if "num_local_experts" in cfg:
        cfg.setdefault("num_experts", cfg["num_local_experts"])
    (src / "config.json").write_text(json.dumps(cfg))
    out = src.parent / "mlx"
    mlx_lm.convert(str(src), mlx_path=str(out), quantize=True, q_group_size=32, q_bits=4)
    return out


def _mlx_logits(path, ids: list[int]) -> torch.Tensor:
    model, _ = mlx_lm.load(str(path))
    return torch.from_numpy(np.array(model(mx.array([ids]))[0].astype(mx.float32)))


def test_stacked_experts_match_mlx_lm(mlx_moe):
    engine = build_engine(str(mlx_moe))
    ids = engine.tokenizer.encode(PROMPT)
    (ours,) = engine.prompt_logits([ids])
    torch.testing.assert_close(ours, _mlx_logits(mlx_moe, ids), rtol=1e-4, atol=1e-4)
    (out,) = engine.generate([ids], SamplingParams(max_tokens=8, ignore_eos=True))
    model, _ = mlx_lm.load(str(mlx_moe))
    seq = list(ids)
    for _ in range(8):
        seq.append(int(mx.argmax(model(mx.array([seq]))[0, -1]).item()))
    assert out.token_ids == seq[len(ids) :]


def test_negative_control_experts_in_the_wrong_order(mlx_moe, monkeypatch):
    import lanes.models.mlx_affine as mlx_affine

    real = mlx_affine.unstack_experts

    def reversed_experts(q, shapes, load):
        q, view, load_expert = real(q, shapes, load)

        def flipped(name):
            parts = name.split(".")
            if "experts" in parts:
                i = parts.index("experts") + 1
                parts[i] = str(7 - int(parts[i]))  # 8 experts
            return load_expert(".".join(parts))

        return q, view, flipped

    monkeypatch.setattr("lanes.models.hf_dir.unstack_experts", reversed_experts)
    engine = build_engine(str(mlx_moe))
    ids = engine.tokenizer.encode(PROMPT)
    (ours,) = engine.prompt_logits([ids])
    assert not torch.allclose(ours, _mlx_logits(mlx_moe, ids), rtol=1e-3, atol=1e-3)
