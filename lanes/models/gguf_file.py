"""Open a GGUF file (via the `gguf` package): config and tokenizer from metadata, tensors
dequantized to float32 on load and renamed to their HF names."""

from __future__ import annotations

import hashlib
import re
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
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
    except (ValueError, OSError) as e:
        raise WeightError(f"cannot read GGUF file {path}: {e}") from e
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
        return fields.get(f"{arch}.{key}", default)

    hidden, heads = int(get("embedding_length")), int(get("attention.head_count"))
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
