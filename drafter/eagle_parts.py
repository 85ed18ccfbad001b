"""What an EAGLE-style head is made of once loaded, whichever layout it came in (a `lanes distill`
directory, drafter/eagle.py; a published EAGLE-3 head, drafter/eagle3_format.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lanes.models import Decoder


@dataclass
class EagleParts:
    decoder: Decoder  # one layer; LM head over the full vocabulary or the rows of `vocab`
    vocab: torch.Tensor | None  # [draft vocab] int64: the target token id of each LM-head row
    feature_layers: tuple[int, ...] | None  # target layers read; None: its final norm
    reduce: torch.Tensor | None  # [hidden, len(feature_layers) * target hidden]
    prenorm_features: bool = False  # those layers' residual stream before the norm (EAGLE-3)
