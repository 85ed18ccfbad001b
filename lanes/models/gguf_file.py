"""Open a GGUF file (via the `gguf` package): config and tokenizer from metadata, tensors
dequantized to float32 on load and renamed to their HF names."""

from __future__ import annotations

import hashlib
import re
import struct
from pathlib import Path

import numpy as np
import torch

from lanes.config import ConfigError, ModelConfig
from lanes.models.checkpoint import Checkpoint
from lanes.models.weights import WeightError
from lanes.tokenizer import Tokenizer

_FAMILIES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_BLOCK = re.compile(r"blk\.(\d+)\.(.+)")


def hf_name(gguf_name: str) -> str:
    """GGUF tensor name -> HF name; names lanes does not know pass through (and are reported)."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _BLOCK.fullmatch(gguf_name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}"
    return gguf_name


def open_gguf(path: Path) -> Checkpoint:
    check_header(path)
    try:
        return _open(path)
    except (ConfigError, WeightError) as e:
        if str(path) in str(e):
            raise
        raise type(e)(f"{path}: {e}") from e
    except Exception as e:  # a malformed file may break the reader anywhere: name the file
        raise WeightError(
            f"cannot read GGUF file {path} (truncated or corrupt?): {type(e).__name__}: {e}"
        ) from e


# GGUF v2/v3 header: magic, uint32 version, uint64 tensor count, uint64 metadata count. The
# smallest tensor record is a name (8-byte length + 1) + dims (4) + one dim (8) + type (4) +
# offset (8); the smallest metadata record a key (8 + 1) + type (4) + a 1-byte value.
_HEADER = struct.Struct("<4sIQQ")
_MIN_TENSOR_RECORD, _MIN_KV_RECORD = 33, 14


def check_header(path: Path) -> None:
    """Refuse a file whose header cannot be true (counts the file is too small to hold), before
    a reader tries to allocate for them."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(_HEADER.size)
    if len(head) < _HEADER.size or head[:4] != b"GGUF":
        raise WeightError(f"{path} is not a GGUF file (no GGUF header; {size} bytes)")
    _, version, num_tensors, num_kv = _HEADER.unpack(head)
    if version not in (2, 3):
        raise WeightError(f"{path}: GGUF version {version} is not supported (2 and 3 are)")
    room = size - _HEADER.size
    if num_tensors * _MIN_TENSOR_RECORD + num_kv * _MIN_KV_RECORD > room:
        raise WeightError(
            f"{path}: the header claims {num_tensors} tensors and {num_kv} metadata entries, "
            f"more than {size} bytes can hold (truncated or corrupt)"
        )


def _open(path: Path) -> Checkpoint:
    import gguf

    reader = gguf.GGUFReader(str(path))
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    tensors = {hf_name(t.name): t for t in reader.tensors}
    if "rope_freqs.weight" in tensors:
        raise ConfigError("GGUF rope_freqs (llama3 rope scaling) is not supported; use an HF dir")
    config = _config(fields, tensors)
    # llama.cpp stores llama-arch q/k rows interleaved per head for its RoPE; HF's layout is
    # rotate-half. Undo that permutation here so the decoder has one RoPE.
    permuted = fields["general.architecture"] == "llama"

    def load(name: str) -> torch.Tensor:
        t = tensors[name]
        try:
            data = gguf.quants.dequantize(t.data, t.tensor_type)
        except (NotImplementedError, ValueError) as e:
            raise WeightError(f"cannot dequantize tensor {name} ({t.tensor_type.name}): {e}") from e
        w = torch.from_numpy(np.array(data, dtype=np.float32))  # a writable copy
        if permuted and ".self_attn.q_proj." in name:
            w = _unpermute(w, config.num_heads)
        elif permuted and ".self_attn.k_proj." in name:
            w = _unpermute(w, config.num_kv_heads)
        return w

    stat = path.stat()
    fingerprint = hashlib.sha256(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return Checkpoint(
        config=config,
        shapes={name: tuple(int(d) for d in reversed(t.shape)) for name, t in tensors.items()},
        load=load,
        tokenizer=Tokenizer.from_gguf_fields(fields),
        source=str(path),
        fingerprint=fingerprint.hexdigest(),
    )


def _unpermute(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Rows per head go from llama.cpp's (half, pair) order back to HF's (pair, half) order."""
    rows = w.shape[0]
    rest = w.shape[1:]
    return w.reshape(num_heads, rows // num_heads // 2, 2, *rest).transpose(1, 2).reshape(w.shape)


def _config(fields: dict, tensors: dict) -> ModelConfig:
    arch = fields.get("general.architecture")
    if arch not in _FAMILIES:
        raise ConfigError(
            f"unsupported GGUF architecture {arch!r}; lanes supports: {', '.join(_FAMILIES)}"
        )

    def get(key: str, default=None):
        value = fields.get(f"{arch}.{key}", default)
        if value is None:
            raise ConfigError(f"GGUF metadata {arch}.{key} is missing")
        return value

    hidden, heads = int(get("embedding_length")), int(get("attention.head_count"))
    if heads <= 0:
        raise ConfigError(
            f"GGUF metadata {arch}.attention.head_count must be positive, got {heads}"
        )
    tokens = fields.get("tokenizer.ggml.tokens") or []
    eos = fields.get("tokenizer.ggml.eos_token_id")
    return ModelConfig(
        family=_FAMILIES[arch],
        vocab_size=int(get("vocab_size", len(tokens))),
        hidden_size=hidden,
        intermediate_size=int(get("feed_forward_length")),
        num_layers=int(get("block_count")),
        num_heads=heads,
        num_kv_heads=int(get("attention.head_count_kv", heads)),
        head_dim=int(get("attention.key_length", hidden // heads)),
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        rope_theta=float(get("rope.freq_base", 10000.0)),
        max_position_embeddings=int(get("context_length", 2048)),
        tie_word_embeddings="lm_head.weight" not in tensors,
        qkv_bias=arch == "qwen2",
        qk_norm=arch == "qwen3",
        bos_token_id=fields.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=(int(eos),) if eos is not None else (),
    )
