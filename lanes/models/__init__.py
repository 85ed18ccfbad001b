"""Models: checkpoints (HF directory, hub cache, GGUF), weight checks, and the decoder."""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

from lanes.config import SUPPORTED_ARCHITECTURES, ConfigError
from lanes.models.checkpoint import Checkpoint
from lanes.models.decoder import Decoder
from lanes.models.resolve import open_checkpoint
from lanes.models.weights import WeightError, assemble, check_shapes

if TYPE_CHECKING:
    import torch

    from lanes.ops import Ops

__all__ = [
    "SUPPORTED_ARCHITECTURES",
    "Checkpoint",
    "ConfigError",
    "Decoder",
    "WeightError",
    "build_decoder",
    "open_checkpoint",
]

_PROGRESS_MIN_PARAMS = 500_000_000


def build_decoder(ckpt: Checkpoint, ops: Ops, dtype: torch.dtype, device: str) -> Decoder:
    """Check the checkpoint against its config, load every tensor, and build the decoder."""
    from huggingface_hub.utils import tqdm

    check_shapes(ckpt.shapes, ckpt.config)
    num_params = sum(math.prod(s) for s in ckpt.shapes.values())
    with tqdm(
        total=len(ckpt.shapes),
        desc="loading weights",
        unit="tensor",
        disable=num_params < _PROGRESS_MIN_PARAMS or None,
    ) as bar:
        weights = assemble(
            ckpt.config, ckpt.load, dtype, device, progress=bar.update, packed=ckpt.packed
        )
    forms = weights.packed_forms()
    packed = "; ".join(f"{n} packed at {b} bits, group {g}" for (b, g), n in sorted(forms.items()))
    logging.getLogger("lanes").info(
        "%s: weights hold %.1f MiB in memory%s",
        ckpt.source,
        weights.nbytes / 2**20,
        f" ({packed}; the rest {str(dtype).removeprefix('torch.')})" if packed else "",
    )
    return Decoder(ckpt.config, weights, ops)
