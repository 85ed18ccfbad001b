"""Published EAGLE-3 heads, loaded as users download them for vLLM and SGLang.

Two config layouts are read:
- the original release: a one-layer Llama config with `draft_vocab_size` (architectures
  ["LlamaForCausalLMEagle3"]), optionally an "eagle_config" {"use_aux_hidden_state",
  "eagle_aux_hidden_state_layer_ids"};
- the `speculators` layout: architectures ["Eagle3Speculator"], the layer's Llama config under
  "transformer_layer_config", and "draft_vocab_size", "eagle_aux_hidden_state_layer_ids",
  "norm_before_residual", "target_hidden_size" at the top.

Tensors (model.safetensors or pytorch_model.bin; an optional "model." prefix on each name):
    midlayer.* or layers.0.*  one decoder layer whose q/k/v read 2 * hidden, namely
                              [input_layernorm(token embedding), hidden_norm(feature)], and
                              whose residual stream starts at the feature itself
    fc.weight                 [hidden, n * target hidden]: n target layers' features -> one
    norm.weight, lm_head.weight   the final norm; the LM head over the draft vocabulary
    d2t                       [draft vocab] int64: target id = draft id + d2t[draft id]
    t2d                       [target vocab] bool: the target ids in the draft vocabulary
    embed_tokens.weight       optional: the target's embedding otherwise

Features: aux layer id j is the residual stream entering target layer j (vLLM's numbering, where
0 would be the embedding), by default (2, L // 2, L - 3) of the target's L layers. lanes keeps
the residual stream after layer j - 1, before the norm, in ascending order of j as the peers
concatenate them. Each later draft step reads the head's own pre-norm output as its feature.
Heads of one layer only: that is what the peers publish.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from lanes.backends import make_ops
from lanes.config import ConfigError, EngineConfig, ModelConfig
from lanes.drafter.eagle_parts import EagleParts
from lanes.models import Checkpoint, Decoder, WeightError, assemble
from lanes.models.weights import expected_shapes

EMBED = "model.embed_tokens.weight"
HIDDEN_NORM = "model.layers.0.hidden_norm.weight"
_FILES = ("model.safetensors", "pytorch_model.bin")


def is_eagle3_dir(path: Path) -> bool:
    """A directory whose config.json declares an EAGLE-3 head."""
    try:
        raw = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(raw, dict):
        return False
    archs = raw.get("architectures") or []
    named = any(isinstance(a, str) and "eagle3" in a.lower() for a in archs)
    return named or raw.get("speculators_model_type") == "eagle3"


def head_config(raw: dict[str, Any], target: ModelConfig) -> tuple[ModelConfig, dict[str, Any]]:
    """The head's layer config and what it says about features:
    {"draft_vocab", "aux_ids" (None: the final norm), "norm_before_residual", "target_hidden"}."""
    layer = raw.get("transformer_layer_config", raw)
    if not isinstance(layer, dict):
        raise ConfigError("EAGLE-3 head: 'transformer_layer_config' must be an object")
    cfg = ModelConfig.from_hf(
        {**layer, "architectures": ["LlamaForCausalLM"], "tie_word_embeddings": False}
    )
    if cfg.num_layers != 1:
        raise ConfigError(
            f"EAGLE-3 head with {cfg.num_layers} layers: lanes loads the one-layer heads the "
            "peers publish"
        )
    eagle = raw.get("eagle_config") or {}
    use_aux = eagle.get("use_aux_hidden_state", True) if isinstance(eagle, dict) else True
    ids = raw.get("eagle_aux_hidden_state_layer_ids")
    if ids is None and isinstance(eagle, dict):
        ids = eagle.get("eagle_aux_hidden_state_layer_ids")
    n = target.num_layers
    if not use_aux:
        ids = None
    elif ids is None:
        ids = [2, n // 2, n - 3]
    if ids is not None:
        if not isinstance(ids, list) or not all(isinstance(j, int) for j in ids):
            raise ConfigError(f"eagle_aux_hidden_state_layer_ids must be layer ids, got {ids!r}")
        if len(set(ids)) != len(ids) or not all(1 <= j < n for j in ids):
            raise ConfigError(
                f"EAGLE-3 head reads target layers {ids}; this target has {n} (ids 1 .. {n - 1}, "
                "each once)"
            )
        ids = sorted(ids)
    draft_vocab = raw.get("draft_vocab_size") or cfg.vocab_size
    return cfg, {
        "draft_vocab": int(draft_vocab),
        "aux_ids": ids,
        "norm_before_residual": bool(raw.get("norm_before_residual", False)),
        "target_hidden": int(raw.get("target_hidden_size") or target.hidden_size),
    }


def lanes_name(name: str) -> str:
    """A head tensor's name in lanes' decoder naming."""
    bare = name.removeprefix("model.")
    for prefix in ("midlayer.", "layers.0."):
        if bare.startswith(prefix):
            return "model.layers.0." + bare.removeprefix(prefix)
    return "model." + bare if bare in ("norm.weight", "embed_tokens.weight") else bare


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    """The head's tensors under lanes' names."""
    file = next((path / f for f in _FILES if (path / f).is_file()), None)
    if file is None:
        raise WeightError(f"{path}: no {' or '.join(_FILES)}")
    try:
        if file.suffix == ".safetensors":
            with safe_open(str(file), framework="pt") as f:
                found = {n: f.get_tensor(n) for n in f.keys()}  # noqa: SIM118 (not a mapping)
        else:
            found = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as e:  # a truncated or foreign file: one line naming it
        raise WeightError(f"cannot read {file}: {type(e).__name__}: {e}") from e
    if not isinstance(found, dict) or not all(isinstance(t, torch.Tensor) for t in found.values()):
        raise WeightError(f"{file} does not hold a flat mapping of tensors")
    return {lanes_name(n): t for n, t in found.items()}


def _expected(cfg: ModelConfig, spec: dict[str, Any], own_embed: bool) -> dict[str, tuple]:
    h = cfg.hidden_size
    want = expected_shapes(cfg)
    if not own_embed:
        del want[EMBED]
    for p in ("q_proj", "k_proj", "v_proj"):  # the first layer reads [embedding, feature]
        name = f"model.layers.0.self_attn.{p}.weight"
        want[name] = (want[name][0], 2 * h)
    want[HIDDEN_NORM] = (h,)
    want["lm_head.weight"] = (spec["draft_vocab"], h)
    if spec["aux_ids"] is not None:
        want["fc.weight"] = (h, len(spec["aux_ids"]) * spec["target_hidden"])
    return want


def _check(found: dict[str, torch.Tensor], want: dict[str, tuple], path: Path) -> None:
    optional = {"d2t", "t2d"}
    missing = sorted(set(want) - set(found))
    unexpected = sorted(set(found) - set(want) - optional)
    wrong = [
        f"{k} has shape {list(found[k].shape)}, expected {list(want[k])}"
        for k in sorted(set(want) & set(found))
        if tuple(found[k].shape) != want[k]
    ]
    problems = (["missing: " + ", ".join(missing)] if missing else []) + (
        ["unexpected: " + ", ".join(unexpected)] if unexpected else []
    )
    if problems or wrong:
        raise WeightError(f"{path} is not an EAGLE-3 head for this target: " + "; ".join(
            problems + wrong[:10]
        ))  # fmt: skip


def draft_vocab_ids(found: dict[str, torch.Tensor], draft_vocab: int, vocab: int, path: Path):
    """[draft vocab] int64 target ids of the LM head's rows (None: the whole vocabulary)."""
    d2t = found.get("d2t")
    if d2t is None:
        if draft_vocab != vocab:
            raise WeightError(f"{path}: a draft vocabulary of {draft_vocab} needs 'd2t'")
        return None
    if tuple(d2t.shape) != (draft_vocab,) or d2t.is_floating_point():
        raise WeightError(f"{path}: 'd2t' must be {draft_vocab} integer offsets")
    ids = torch.arange(draft_vocab, dtype=torch.int64) + d2t.to(torch.int64)
    if int(ids.min()) < 0 or int(ids.max()) >= vocab or len(torch.unique(ids)) != draft_vocab:
        raise WeightError(f"{path}: 'd2t' maps draft ids outside or onto the same target ids")
    t2d = found.get("t2d")
    if t2d is not None and (
        tuple(t2d.shape) != (vocab,)
        or int(t2d.sum()) != draft_vocab
        or not bool(t2d.bool()[ids].all())
    ):
        raise WeightError(f"{path}: 't2d' and 'd2t' name different draft vocabularies")
    return ids


def load_eagle3(path: Path, target: Checkpoint, config: EngineConfig) -> EagleParts:
    """A published EAGLE-3 head as lanes' EAGLE parts, checked against the target."""
    raw = json.loads((path / "config.json").read_text())
    tcfg = target.config
    cfg, spec = head_config(raw, tcfg)
    if cfg.vocab_size != tcfg.vocab_size:
        raise ConfigError(
            f"EAGLE-3 head {path} was made for a vocabulary of {cfg.vocab_size}; this target has "
            f"{tcfg.vocab_size}"
        )
    if spec["target_hidden"] != tcfg.hidden_size:
        raise ConfigError(
            f"EAGLE-3 head {path} was made for a target of hidden size {spec['target_hidden']}; "
            f"this target has {tcfg.hidden_size}"
        )
    found = read_tensors(path)
    own_embed = EMBED in found
    if not own_embed and cfg.hidden_size != tcfg.hidden_size:
        raise ConfigError(f"EAGLE-3 head {path} has no embedding and another width than the target")
    _check(found, _expected(cfg, spec, own_embed), path)
    vocab = draft_vocab_ids(found, spec["draft_vocab"], cfg.vocab_size, path)

    def load(name: str) -> torch.Tensor:
        return found[name] if name in found else target.load(name)

    def packed(name: str):  # the target's embedding as the target holds it
        return target.packed(name) if name == EMBED and not own_embed and target.packed else None

    dtype = getattr(torch, config.torch_dtype_name)
    weights = assemble(cfg, load, dtype, config.device, packed=packed)
    weights.hidden_norm = found[HIDDEN_NORM].to(device=config.device, dtype=dtype)
    weights.norm_before_residual = spec["norm_before_residual"]
    ops = make_ops(config.exact, config.device, config.kernels)
    ids = spec["aux_ids"]
    return EagleParts(
        Decoder(cfg, weights, ops),
        None if vocab is None else vocab.to(config.device),
        None if ids is None else tuple(j - 1 for j in ids),
        None if ids is None else found["fc.weight"].to(device=config.device, dtype=dtype),
        prenorm_features=ids is not None,
    )
