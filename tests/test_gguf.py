"""GGUF: a tiny model written as llama.cpp writes it loads to transformers' logits; the default
model (SmolLM2-135M-Instruct, Q4_1 GGUF from the PyPI wheel) answers a question."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lanes import EngineConfig, SamplingParams, build_engine
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


def write_tokenizer(w, hf_dir, pad_to: int = 1) -> None:
    """The checkpoint's BPE tokenizer as llama.cpp's converter writes it; pad_to: the token list
    padded with [PADi] tokens to a multiple of it (the converter does so for Mamba-2 models)."""
    tok = json.loads((hf_dir / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    special = {a["content"] for a in tok["added_tokens"]}
    types = [3 if t in special else 1 for t in tokens]
    while len(tokens) % pad_to:
        tokens.append(f"[PAD{len(tokens)}]")
        types.append(5)  # unused
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(0)
    w.add_chat_template(CHATML)


def add_tensor(w, name: str, a: np.ndarray, kind: str | None) -> None:
    """One tensor into the writer: as float32, or quantized to llama.cpp's block type `kind`."""
    import gguf

    if kind is None:
        w.add_tensor(name, np.ascontiguousarray(a))
    else:
        qtype = gguf.GGMLQuantizationType[kind]
        w.add_tensor(name, gguf.quants.quantize(np.ascontiguousarray(a), qtype), raw_dtype=qtype)


def write_gguf(path, hf_dir, hf_model, quantize=None):
    """quantize: HF tensor name -> a llama.cpp block type name (Q4_0, Q4_1, Q8_0) or None."""
    import gguf

    cfg = hf_model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(10000.0)
    write_tokenizer(w, hf_dir)
    for name, t in hf_model.state_dict().items():
        a = t.float().numpy()
        if name.endswith("q_proj.weight"):
            a = _permute_like_llama_cpp(a, cfg.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            a = _permute_like_llama_cpp(a, cfg.num_key_value_heads)
        add_tensor(w, _gguf_name(name), a, quantize(name) if quantize is not None else None)
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


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0"])
def test_gguf_blocks_are_affine_codes(kind):
    """llama.cpp's blocks rewritten as lanes' packed codes (scale * code + bias per 32 inputs)
    dequantize to gguf's own floats bit for bit; read with the nibbles in the order of the
    bytes (the natural mistake) they do not."""
    import gguf

    from lanes.packed import dequantize

    x = np.random.default_rng(1).standard_normal((6, 128)).astype(np.float32)
    qtype = gguf.GGMLQuantizationType[kind]
    blocks = gguf.quants.quantize(x, qtype)
    theirs = torch.from_numpy(np.asarray(gguf.quants.dequantize(blocks, qtype), np.float32))
    codes, scales, biases, bits = gguf_file.affine_codes(blocks, kind)
    ours = dequantize(*map(torch.from_numpy, (codes, scales, biases)), bits, 32)
    assert torch.equal(ours, theirs)
    if bits == 4:  # nibbles low, high of byte 0, then of byte 1, ...: another weight
        size = gguf_file._AFFINE_BLOCKS[kind][0]
        by_byte = blocks.reshape(6, -1, size).copy()
        nibbles = by_byte[..., size - 16 :]
        lo, hi = nibbles & 0xF, nibbles >> 4
        pairs = np.stack([lo, hi], axis=-1).reshape(6, -1, 32)
        by_byte[..., size - 16 :] = pairs[..., :16] | (pairs[..., 16:] << 4)
        wrong = gguf_file.affine_codes(by_byte.reshape(6, -1), kind)
        assert not torch.equal(dequantize(*map(torch.from_numpy, wrong[:3]), bits, 32), theirs)


def _quantized_gguf(tiny_models, path):
    """The tiny Llama as llama.cpp would quantize it: Q4_0 projections in layer 0, Q4_1 in the
    rest, Q8_0 embedding and LM head."""
    hf_dir, hf = tiny_models["llama"]

    def quantize(name: str):
        if name.endswith(("embed_tokens.weight", "lm_head.weight")):
            return "Q8_0"
        if name.endswith("_proj.weight"):
            return "Q4_0" if ".layers.0." in name else "Q4_1"
        return None

    write_gguf(path, hf_dir, hf, quantize)
    return path


def test_a_quantized_gguf_served_packed(tiny_models, tmp_path):
    """Q4_0 / Q4_1 / Q8_0 weights (q and k rows in llama.cpp's order) kept as codes: the same
    logits as the GGUF dequantized at load, in a fraction of the memory; a lane's tokens are the
    same alone and batched."""
    path = _quantized_gguf(tiny_models, tmp_path / "q.gguf")
    packed = build_engine(str(path), EngineConfig(gguf_packed=True))
    floats = build_engine(str(path), EngineConfig(gguf_packed=False))
    assert packed.runner.decoder.weights.packed_forms() == {(4, 32): 8, (8, 32): 2}
    assert packed.runner.decoder.weights.nbytes < floats.runner.decoder.weights.nbytes / 3
    text = "The quick brown fox jumps over the lazy dog. 0123 Paris!"
    ids = floats.tokenizer.encode(text)
    torch.testing.assert_close(
        packed.prompt_logits([ids])[0], floats.prompt_logits([ids])[0], rtol=1e-5, atol=1e-5
    )
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    prompts = [text, "Paris is the capital of"]
    solo = [packed.generate([p], params)[0].token_ids for p in prompts]
    assert [c.token_ids for c in packed.generate(prompts, params)] == solo
    assert solo[0] == floats.generate([text], params)[0].token_ids


def test_a_packed_gguf_on_the_triton_ops(tiny_models, tmp_path):
    """The packed GGUF through the Triton kernels (interpreted on the CPU, native on a GPU): the
    matmul dequantizes groups of 32 at 4 and 8 bits in registers; the logits are the plain
    torch path's and a lane's tokens are the same alone and batched."""
    path = _quantized_gguf(tiny_models, tmp_path / "q.gguf")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    base = dict(gguf_packed=True, device=device, dtype="float32")
    triton = build_engine(str(path), EngineConfig(**base, kernels="triton"))
    plain = build_engine(str(path), EngineConfig(**base, kernels="torch"))
    assert triton.ops.name == "triton"
    text = "The quick brown fox jumps over the lazy dog. 0123 Paris!"
    ids = plain.tokenizer.encode(text)
    torch.testing.assert_close(
        triton.prompt_logits([ids])[0], plain.prompt_logits([ids])[0], rtol=1e-4, atol=1e-4
    )
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    prompts = [text, "Paris is the capital of"]
    solo = [triton.generate([p], params)[0].token_ids for p in prompts]
    assert [c.token_ids for c in triton.generate(prompts, params)] == solo


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
