"""Nemotron-H from GGUF: a tiny model written as llama.cpp's converter writes it (tensor names
from the gguf package's own name map, the converter's reshapes and its q/k permutation) loads to
transformers' logits, and to the same model as its HF directory loads; files lanes cannot read
as Nemotron-H are refused in one line."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from lanes import EngineConfig, build_engine
from lanes.config import ConfigError
from lanes.models import gguf_nemotron_h
from tests.test_gguf import _permute_like_llama_cpp, add_tensor, write_tokenizer

# the converter writes a context of 2**20 tokens for a model without RoPE: tests take less
FLOATS = EngineConfig(max_model_len=512, gguf_packed=False)
TEXT = "The quick brown fox jumps over the lazy dog. 0123 Paris!"


def write_nemotron_h_gguf(path, hf_dir, hf_model, quantize=None, blocks=None):
    """quantize: checkpoint tensor name -> a llama.cpp block type (Q8_0, ...) or None; blocks: the
    per-block (KV heads, feed-forward length) the metadata claims, when a test needs a lie."""
    import gguf

    cfg = hf_model.config
    kinds = cfg.layers_block_type
    n = cfg.num_hidden_layers
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.NEMOTRON_H, n)
    w = gguf.GGUFWriter(str(path), "nemotron_h")
    w.add_block_count(n)
    w.add_context_length(2**20)  # what the converter writes for a model without RoPE
    w.add_embedding_length(cfg.hidden_size)
    # transformers 5 names the kinds linear_attention (Mamba-2), full_attention and mlp
    kv = [cfg.num_key_value_heads if k in ("attention", "full_attention") else 0 for k in kinds]
    ff = [cfg.intermediate_size if k == "mlp" else 0 for k in kinds]
    if blocks is not None:
        kv, ff = [b[0] for b in blocks], [b[1] for b in blocks]
    w.add_feed_forward_length(ff)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(kv)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_layer_norm_rms_eps(cfg.layer_norm_epsilon)
    w.add_ssm_conv_kernel(cfg.conv_kernel)
    w.add_ssm_state_size(cfg.ssm_state_size)
    w.add_ssm_group_count(cfg.n_groups)
    w.add_ssm_inner_size(cfg.mamba_num_heads * cfg.mamba_head_dim)
    w.add_ssm_time_step_rank(cfg.mamba_num_heads)
    w.add_rope_scaling_finetuned(False)
    write_tokenizer(w, hf_dir, pad_to=256)  # a token list longer than the embedding
    groups = cfg.n_groups
    for name, t in _saved_tensors(hf_dir).items():  # what the converter reads
        a = t.float().numpy()
        source = name.replace(".dt_bias", ".dt_proj.bias")  # the converter's rename
        if name.endswith(".A_log"):
            a = -np.exp(a).reshape(-1, 1)
        elif name.endswith(".D"):
            a = a.reshape(-1, 1)
        elif name.endswith(".conv1d.weight"):
            a = a.squeeze(1)
        elif name.endswith(".mixer.norm.weight"):
            a = a.reshape(groups, -1)
        elif name.endswith("q_proj.weight"):
            a = _permute_like_llama_cpp(a, cfg.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            a = _permute_like_llama_cpp(a, cfg.num_key_value_heads)
        target = names.get_name(source, try_suffixes=(".weight", ".bias"))
        assert target is not None, name
        add_tensor(w, target, a, quantize(name) if quantize is not None else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _saved_tensors(hf_dir) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    tensors = {}
    for f in sorted(hf_dir.glob("*.safetensors")):
        tensors.update(load_file(f))
    return tensors


@pytest.fixture(scope="module")
def nemotron_gguf(tiny_models, tmp_path_factory):
    hf_dir, hf = tiny_models["nemotron_h"]
    path = tmp_path_factory.mktemp("gguf") / "nemotron-h.gguf"
    write_nemotron_h_gguf(path, hf_dir, hf)
    return path


def _logits(engine, ids):
    (logits,) = engine.prompt_logits([ids])
    return logits


def test_nemotron_h_gguf_matches_transformers(tiny_models, nemotron_gguf):
    hf_dir, hf = tiny_models["nemotron_h"]
    from_gguf = build_engine(str(nemotron_gguf), FLOATS)
    from_dir = build_engine(str(hf_dir))
    cfg = from_gguf.model_config
    mamba = dataclasses.replace(cfg.mamba, eps=1e-5)  # GGUF holds the epsilon as float32
    assert cfg.layer_types == from_dir.model_config.layer_types
    assert mamba == from_dir.model_config.mamba and cfg.mamba.eps == pytest.approx(1e-5)
    assert cfg.vocab_size == hf.config.vocab_size and not cfg.attention_rope
    ids = from_dir.tokenizer.encode(TEXT)
    assert from_gguf.tokenizer.encode(TEXT) == ids
    ours = _logits(from_gguf, ids)
    with torch.no_grad():
        theirs = hf(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(ours, _logits(from_dir, ids), rtol=1e-5, atol=1e-5)
    assert (ours.argmax(-1) == theirs.argmax(-1)).all()


def test_nemotron_h_gguf_layouts_are_undone(tiny_models, nemotron_gguf, monkeypatch):
    """Negative control: with the converter's reshapes read as they are (A taken for A_log), the
    logits leave transformers' — the test above sees a wrong layout."""
    hf_dir, hf = tiny_models["nemotron_h"]
    ids = build_engine(str(hf_dir)).tokenizer.encode(TEXT)
    shape_only = lambda name, data: (  # noqa: E731
        data.reshape(-1) if name.endswith((".A_log", ".D", ".norm.weight")) else
        data.reshape(data.shape[0], 1, -1) if name.endswith(".conv1d.weight") else data
    )  # fmt: skip
    monkeypatch.setattr(gguf_nemotron_h, "hf_layout", shape_only)
    with torch.no_grad():
        theirs = hf(torch.tensor([ids])).logits[0]
    ours = _logits(build_engine(str(nemotron_gguf), FLOATS), ids)
    assert not torch.allclose(ours, theirs, rtol=1e-4, atol=1e-4)  # the bound the test above holds


def test_a_quantized_nemotron_h_gguf_served_packed(tiny_models, tmp_path):
    """Q8_0 projections stay codes; the conv window, A, D and norms (F32 in llama.cpp's files)
    and anything reshaped back load as floats, and the logits stay near the float file's."""
    hf_dir, hf = tiny_models["nemotron_h"]
    path = tmp_path / "q8.gguf"
    quantized = lambda name: "Q8_0" if name.endswith("_proj.weight") else None  # noqa: E731
    write_nemotron_h_gguf(path, hf_dir, hf, quantize=quantized)
    engine = build_engine(str(path), EngineConfig(max_model_len=512, gguf_packed=True))
    forms = engine.runner.decoder.weights.packed_forms()
    assert forms.get((8, 32), 0) > 0
    ids = engine.tokenizer.encode(TEXT)
    with torch.no_grad():
        theirs = hf(torch.tensor([ids])).logits[0]
    assert (_logits(engine, ids) - theirs).abs().max() < 0.1


def test_nemotron_h_gguf_refusals(tiny_models, tmp_path):
    hf_dir, hf = tiny_models["nemotron_h"]
    n = hf.config.num_hidden_layers
    both = tmp_path / "both.gguf"
    write_nemotron_h_gguf(both, hf_dir, hf, blocks=[(2, 64)] * n)
    with pytest.raises(ConfigError, match="block 0 has both KV heads and a feed-forward length"):
        build_engine(str(both), FLOATS)
    short = tmp_path / "short.gguf"
    write_nemotron_h_gguf(short, hf_dir, hf, blocks=[(0, 0)] * (n - 1))
    with pytest.raises(ConfigError, match="head_count_kv has 5 entries for 6 blocks"):
        build_engine(str(short), FLOATS)
