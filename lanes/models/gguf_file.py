"""Open a GGUF file (via the `gguf` package): config and tokenizer from metadata, tensors
dequantized to float32 on load and renamed to their HF names (Nemotron-H's own names and
layouts: lanes.models.gguf_nemotron_h). With `packed`, Q4_0, Q4_1 and
Q8_0 weights stay codes instead (lanes.packed's affine form, groups of 32): llama.cpp's blocks
are already scale * code + bias per 32 inputs, so only the nibble order and the offsets change."""

from __future__ import annotations

import hashlib
import re
import struct
from pathlib import Path

import numpy as np
import torch

from lanes.config import ConfigError, ModelConfig
from lanes.models import gguf_nemotron_h
from lanes.models.checkpoint import Checkpoint
from lanes.models.weights import WeightError
from lanes.packed import PackedWeight
from lanes.tokenizer import Tokenizer

_FAMILIES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "nemotron_h": "nemotron_h"}

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


def hf_name(gguf_name: str, arch: str = "llama") -> str:
    """GGUF tensor name -> HF name; names lanes does not know pass through (and are reported)."""
    if arch == gguf_nemotron_h.ARCH:
        names = gguf_nemotron_h.GLOBAL_NAMES, gguf_nemotron_h.BLOCK_NAMES
        prefix = gguf_nemotron_h.BLOCK_PREFIX
    else:
        names, prefix = (_GLOBAL_NAMES, _LAYER_NAMES), "model.layers"
    global_names, block_names = names
    if gguf_name in global_names:
        return global_names[gguf_name]
    m = _BLOCK.fullmatch(gguf_name)
    if m and m.group(2) in block_names:
        return f"{prefix}.{m.group(1)}.{block_names[m.group(2)]}"
    return gguf_name


def open_gguf(path: Path, packed: bool = False) -> Checkpoint:
    """packed: keep Q4_0, Q4_1 and Q8_0 weights as codes (the decoder's packed path) instead of
    dequantizing them to float."""
    check_header(path)
    try:
        return _open(path, packed)
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


def _open(path: Path, packed: bool) -> Checkpoint:
    import gguf

    reader = gguf.GGUFReader(str(path))
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    arch = fields.get("general.architecture")
    nemotron_h = arch == gguf_nemotron_h.ARCH
    tensors = {hf_name(t.name, arch): t for t in reader.tensors}
    if "rope_freqs.weight" in tensors:
        raise ConfigError("GGUF rope_freqs (llama3 rope scaling) is not supported; use an HF dir")
    file_shapes = {name: tuple(int(d) for d in reversed(t.shape)) for name, t in tensors.items()}
    if nemotron_h:
        shapes = {n: gguf_nemotron_h.hf_shape(n, s) for n, s in file_shapes.items()}
        config = ModelConfig.from_hf(gguf_nemotron_h.hf_config(fields, shapes))
    else:
        shapes = file_shapes
        config = _config(fields, tensors)
    # llama.cpp stores llama-arch q/k rows interleaved per head for its RoPE (and Nemotron-H's,
    # whose converter is llama's); HF's layout is rotate-half. Undo that permutation here so
    # the decoder has one RoPE.
    permuted = arch in ("llama", gguf_nemotron_h.ARCH)

    def rows_in_hf_order(name: str, w: torch.Tensor) -> torch.Tensor:
        if permuted and ".q_proj." in name:  # weights and any bias
            return _unpermute(w, config.num_heads)
        if permuted and ".k_proj." in name:
            return _unpermute(w, config.num_kv_heads)
        return w

    def load(name: str) -> torch.Tensor:
        t = tensors[name]
        try:
            data = gguf.quants.dequantize(t.data, t.tensor_type)
        except (NotImplementedError, ValueError) as e:
            raise WeightError(f"cannot dequantize tensor {name} ({t.tensor_type.name}): {e}") from e
        data = np.array(data, dtype=np.float32)
        if nemotron_h:
            data = gguf_nemotron_h.hf_layout(name, data)
        return rows_in_hf_order(name, torch.from_numpy(data))

    def load_packed(name: str) -> PackedWeight | None:
        t = tensors[name]
        if t.tensor_type.name not in _AFFINE_BLOCKS or len(t.shape) != 2:
            return None
        if nemotron_h and shapes[name] != file_shapes[name]:  # reshaped back: not a linear
            return None
        try:
            codes, scales, biases, bits = affine_codes(np.asarray(t.data), t.tensor_type.name)
        except ValueError as e:  # a block count that does not fit the row
            raise WeightError(f"cannot read tensor {name} ({t.tensor_type.name}): {e}") from e
        return PackedWeight(
            *(rows_in_hf_order(name, torch.from_numpy(x)) for x in (codes, scales, biases)),
            bits,
            _GROUP,
        )

    stat = path.stat()
    # packed and float weights give other bits: the prompt cache must not mix them
    form = ":packed" if packed else ""
    fingerprint = hashlib.sha256(
        f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}{form}".encode()
    )
    return Checkpoint(
        config=config,
        shapes=shapes,
        load=load,
        tokenizer=Tokenizer.from_gguf_fields(fields),
        source=str(path),
        fingerprint=fingerprint.hexdigest(),
        packed=load_packed if packed else None,
    )


_GROUP = 32  # inputs per llama.cpp block, hence per affine group
# bytes per block and bits per code
_AFFINE_BLOCKS = {"Q4_0": (18, 4), "Q4_1": (20, 4), "Q8_0": (34, 8)}


def affine_codes(data: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """llama.cpp blocks [rows, blocks * bytes] (uint8) -> (uint32 codes [rows, inputs * bits /
    32], least significant first; scales and biases [rows, inputs / 32] float32; bits), so that
    w = scale * code + bias:
      Q4_0: d (fp16), 16 bytes of nibbles: inputs 0-15 the low nibbles, 16-31 the high ones;
            w = d * (q - 8)   -> scale d, bias -8 d
      Q4_1: d, m (fp16), the same nibbles; w = d * q + m   -> scale d, bias m
      Q8_0: d (fp16), 32 int8; w = d * q   -> code q + 128, scale d, bias -128 d"""
    size, bits = _AFFINE_BLOCKS[kind]
    rows = data.shape[0]
    blocks = data.reshape(rows, -1, size)

    def half(offset: int) -> np.ndarray:  # an fp16 field of every block, as float32
        field = np.ascontiguousarray(blocks[..., offset : offset + 2])
        return field.view(np.float16)[..., 0].astype(np.float32)

    d = half(0)
    if bits == 4:
        nibbles = blocks[..., 4:] if kind == "Q4_1" else blocks[..., 2:]
        q = np.concatenate([nibbles & 0xF, nibbles >> 4], axis=-1)  # [rows, blocks, 32]
        bias = half(2) if kind == "Q4_1" else -8 * d
    else:
        q = np.ascontiguousarray(blocks[..., 2:]).view(np.int8).astype(np.int16) + 128
        bias = -128 * d
    per_word = 32 // bits
    q = q.reshape(rows, -1, per_word).astype(np.uint32)
    shifts = (np.arange(per_word, dtype=np.uint32) * bits).astype(np.uint32)
    codes = np.bitwise_or.reduce(q << shifts, axis=-1).astype(np.uint32)
    return codes, d, bias.astype(np.float32), bits


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
