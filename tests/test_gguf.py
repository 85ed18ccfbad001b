"""GGUF: a tiny model written as llama.cpp writes it loads to transformers' logits; the default
model (SmolLM2-135M-Instruct, Q4_1 GGUF from the PyPI wheel) answers a question."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lanes import SamplingParams, build_engine
from lanes.models import gguf_file
from lanes.models.resolve import default_gguf
from tests.conftest import CHATML


def _permute_like_llama_cpp(w: np.ndarray, num_heads: int) -> np.ndarray:
    # HF rotate-half rows -> llama.cpp's interleaved rows (what convert_hf_to_gguf does)
    return (
        w.reshape(num_heads, 2, w.shape[0] // num_heads // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def _gguf_name(hf: str) -> str:
    inverse = {v: k for k, v in gguf_file._GLOBAL_NAMES.items()}
    if hf in inverse:
        return inverse[hf]
    _, _, i, rest = hf.split(".", 3)
    layer = {v: k for k, v in gguf_file._LAYER_NAMES.items()}
    return f"blk.{i}.{layer[rest]}"


def write_gguf(path, hf_dir, hf_model):
    import gguf

    cfg = hf_model.config
    tok = json.loads((hf_dir / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    special = {a["content"] for a in tok["added_tokens"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(10000.0)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in special else 1 for t in tokens])
    w.add_token_merges(merges)
    w.add_eos_token_id(0)
    w.add_chat_template(CHATML)
    for name, t in hf_model.state_dict().items():
        a = t.float().numpy()
        if name.endswith("q_proj.weight"):
            a = _permute_like_llama_cpp(a, cfg.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            a = _permute_like_llama_cpp(a, cfg.num_key_value_heads)
        w.add_tensor(_gguf_name(name), np.ascontiguousarray(a))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_tiny_gguf_matches_transformers(tiny_models, tmp_path):
    hf_dir, hf = tiny_models["llama"]
    path = tmp_path / "tiny.gguf"
    write_gguf(path, hf_dir, hf)
    from_gguf, from_dir = build_engine(str(path)), build_engine(str(hf_dir))
    text = "The quick brown fox jumps over the lazy dog. 0123 Paris!"
    ids = from_dir.tokenizer.encode(text)
    assert from_gguf.tokenizer.encode(text) == ids
    (ours,) = from_gguf.prompt_logits([ids])
    with torch.no_grad():
        theirs = hf(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)


def test_tokenizer_export_from_a_gguf(tiny_models, tmp_path):
    """`lanes tokenizer X.gguf --out DIR` writes an HF tokenizer directory that transformers
    loads and that tokenizes, chat-templates and decodes as lanes does (benchmark clients need
    one; a GGUF's tokenizer is inside the file)."""
    import subprocess
    import sys

    import transformers

    hf_dir, hf = tiny_models["llama"]
    path = tmp_path / "tiny.gguf"
    write_gguf(path, hf_dir, hf)
    out = tmp_path / "tok"
    done = subprocess.run(
        [sys.executable, "-m", "lanes.cli", "tokenizer", str(path), "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (out / "tokenizer.json").is_file() and (out / "tokenizer_config.json").is_file()
    ours = build_engine(str(path)).tokenizer
    theirs = transformers.AutoTokenizer.from_pretrained(str(out))
    text = "The quick brown fox jumps over the lazy dog. 0123 Paris!"
    assert theirs(text)["input_ids"] == ours.encode(text)
    chat = [{"role": "user", "content": "Hi there"}]
    assert ours.chat_template == CHATML
    assert theirs.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == (
        ours.apply_chat_template(chat)
    )
    assert theirs.decode(ours.encode(text)) == ours.decode(ours.encode(text))


def test_lanes_models_writes_and_shows_the_default_tokenizer(tiny_models, tmp_path, monkeypatch,
                                                             capsys):  # fmt: skip
    """Without the hub, the default model is its GGUF; `lanes models` says where it is and where
    its tokenizer's HF files are, written once (transformers loads them)."""
    import transformers

    import lanes.cli
    from lanes.models import resolve

    monkeypatch.setenv("LANES_CACHE", str(tmp_path))
    monkeypatch.setattr(resolve, "cached_snapshot", lambda repo_id: None)
    assert lanes.cli.main(["models"]) == 0
    assert "not fetched yet" in capsys.readouterr().out
    hf_dir, hf = tiny_models["llama"]
    write_gguf(tmp_path / resolve.DEFAULT_GGUF, hf_dir, hf)  # the tiny model in its place
    assert lanes.cli.main(["models"]) == 0
    out = capsys.readouterr().out
    tok = resolve.default_tokenizer_dir()
    assert f"tokenizer    {tok} " in out and str(tmp_path / resolve.DEFAULT_GGUF) in out
    written = (tok / "tokenizer.json").stat().st_mtime_ns
    assert transformers.AutoTokenizer.from_pretrained(str(tok))("Paris")["input_ids"]
    assert lanes.cli.main(["models"]) == 0  # written once
    assert (tok / "tokenizer.json").stat().st_mtime_ns == written


def test_unpermute_is_the_inverse():
    w = torch.arange(4 * 8 * 3, dtype=torch.float32).reshape(4 * 8, 3)
    permuted = torch.from_numpy(_permute_like_llama_cpp(w.numpy(), 4))
    assert not torch.equal(permuted, w)
    assert torch.equal(gguf_file._unpermute(permuted, 4), w)


@pytest.fixture(scope="module")
def default_engine():
    return build_engine(str(default_gguf()))


@pytest.mark.slow
def test_default_model_knows_paris(default_engine):
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    (out,) = default_engine.generate([chat], SamplingParams(max_tokens=24))
    assert "Paris" in out.text


@pytest.mark.slow
def test_default_tokenizer_matches_transformers_gguf_reader(default_engine):
    from transformers import AutoTokenizer

    path = default_gguf()
    theirs = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    for text in ["Hello world 12345!", "  tabs\tand\n\nlines", "émoji 😀 中文", "<|im_start|>user"]:
        assert default_engine.tokenizer.encode(text) == theirs.encode(
            text, add_special_tokens=False
        )
