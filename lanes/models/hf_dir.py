"""Open a local Hugging Face model directory: config.json, *.safetensors (single or sharded)."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from safetensors import SafetensorError, safe_open

from lanes.config import VISION_LANGUAGE, ConfigError, ModelConfig
from lanes.models.checkpoint import Checkpoint
from lanes.models.mlx_affine import packed_view, quantization, unstack_experts
from lanes.models.weights import WeightError
from lanes.tokenizer import Tokenizer


def open_hf_dir(path: Path) -> Checkpoint:
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ConfigError(f"{path} has no config.json")
    try:
        raw = json.loads(config_file.read_text())
        config = ModelConfig.from_hf(raw)
        quant = quantization(raw)
    except (ValueError, UnicodeDecodeError) as e:  # ConfigError, JSONDecodeError
        raise ConfigError(f"{config_file}: {e}") from e
    files = _safetensors_files(path)
    where: dict[str, Path] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as st:
                for name in st.keys():  # noqa: SIM118 (safe_open is not a mapping)
                    where[name] = f
                    shapes[name] = tuple(st.get_slice(name).get_shape())
        except (SafetensorError, OSError) as e:
            raise WeightError(f"cannot read {f.name}: {e}") from e

    rename = _language_model_names(raw, shapes)
    if rename is not None:  # a vision-language wrapper: its language model, under our names
        where = {rename[k]: f for k, f in where.items() if k in rename}
        shapes = {rename[k]: v for k, v in shapes.items() if k in rename}
        stored = {ours: theirs for theirs, ours in rename.items()}
    handles: dict[Path, object] = {}

    def load(name: str):
        if rename is not None:
            name, ours = stored[name], name
            f = where[ours]
        else:
            f = where[name]
        try:
            if f not in handles:
                handles[f] = safe_open(str(f), framework="pt")
            return handles[f].get_tensor(name)
        except (SafetensorError, OSError, RuntimeError) as e:
            raise WeightError(f"cannot load tensor {name} from {f.name}: {e}") from e

    packed = None
    quant, shapes, load = unstack_experts(quant, shapes, load)  # mlx-lm's stacked experts
    if quant is not None:  # MLX affine codes: kept packed by the decoder
        try:
            shapes, load, packed = packed_view(quant, shapes, load)
        except ConfigError as e:
            raise ConfigError(f"{config_file}: {e}") from e

    digest = hashlib.sha256(config_file.read_bytes())
    for f in files:
        digest.update(f"{f.name}:{f.stat().st_size}:{f.stat().st_mtime_ns}".encode())
    return Checkpoint(
        config=config,
        shapes=shapes,
        load=load,
        tokenizer=Tokenizer.from_hf_dir(path, config),
        source=str(path),
        fingerprint=digest.hexdigest(),
        packed=packed,
    )


def _language_model_names(raw: dict, shapes: dict) -> dict[str, str] | None:
    """Qwen3.5's vision-language checkpoints (dense and MoE) keep the text model under model.language_model.*
    (and lm_head.weight); the vision tower (model.visual.*) is skipped. Stored -> lanes names."""
    if (raw.get("architectures") or [None])[0] not in VISION_LANGUAGE:
        return None
    inner = "model.language_model."
    rename = {k: "model." + k[len(inner) :] for k in shapes if k.startswith(inner)}
    rename.update({k: k for k in shapes if k == "lm_head.weight"})
    skipped = [k for k in shapes if k not in rename]
    if skipped:
        logging.getLogger("lanes").info(
            "serving the language model only: %d tensors of the vision tower skipped", len(skipped)
        )
    return rename


def _shard_names(index: Path) -> set[str]:
    """The shard files an index's weight_map names: plain file names inside the model's
    directory (never `../other/model.safetensors` or an absolute path)."""
    try:
        raw = json.loads(index.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise WeightError(f"{index.name} is not JSON: {str(e)[:100]}") from e
    weight_map = raw.get("weight_map") if isinstance(raw, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise WeightError(f"{index.name} needs a 'weight_map' of tensor names to shard files")
    names = set(weight_map.values())
    outside = sorted(n for n in names if Path(n).name != n or n in ("", ".", ".."))
    if outside:
        raise WeightError(
            f"{index.name} names shards outside the model's directory: {', '.join(outside)[:200]}"
        )
    return names


def _safetensors_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(_shard_names(index))
        files = [path / n for n in names]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise WeightError(f"shards named in {index.name} are missing: {', '.join(missing)}")
        return files
    files = sorted(path.glob("*.safetensors"))
    if not files:
        if any(path.glob("*.bin")) or any(path.glob("*.pt")):
            raise WeightError(f"{path} has only pickle weights (.bin/.pt); lanes loads safetensors")
        raise WeightError(f"{path} has no *.safetensors files")
    return files
