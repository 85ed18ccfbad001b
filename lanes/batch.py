"""ForwardBatch: one flat forward over tokens of several lanes, and the metadata attention needs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class SeqSlice:
    """One lane's part of a forward.

    Its queries are rows [query_start, query_start + num_queries) of the flat batch, at positions
    [context_len - num_queries, context_len); `kv_slots` [context_len] are the pool slots of every
    position 0..context_len-1 (cached ones and the ones this forward writes).
    """

    query_start: int
    num_queries: int
    context_len: int
    kv_slots: torch.Tensor  # [context_len] int64

    @property
    def first_position(self) -> int:
        return self.context_len - self.num_queries


@dataclass(frozen=True)
class ForwardBatch:
    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64
    slot_mapping: torch.Tensor  # [num_tokens] int64: where each token's K and V are written
    seqs: tuple[SeqSlice, ...]
    logits_indices: torch.Tensor  # [num_logits] int64: rows whose next-token logits are wanted
    attn_meta: Any = field(default=None, compare=False)  # built by Ops.prepare (Triton ops)
    # [num_tokens, hidden]: the target's features each row reads (EAGLE-style drafters only)
    features: torch.Tensor | None = field(default=None, compare=False)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])
