"""ForwardBatch: one flat forward over tokens of several lanes, and the metadata attention needs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from lanes.lane_rows import LaneRows


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
    # hybrid models: the lane's recurrent-state slot (cache.state_pool), and whether the step only
    # reads it (verify steps, whose trailing rows may be rejected: settled once acceptance is known)
    state_slot: int = -1
    keep_states: bool = False

    @property
    def first_position(self) -> int:
        return self.context_len - self.num_queries


@dataclass(frozen=True)
class LaneStates:
    """Hybrid models in a CUDA graph, where no SeqSlice says which lane is where: lane i's rows
    are [i * rows_per_lane, (i + 1) * rows_per_lane) and its recurrent state is slot slots[i] of
    the state pool (padding lanes: the scratch slot). Decode steps advance the slots in place;
    verify steps (`keep`) leave them and copy each linear layer's inputs (a DeltaNet's
    (mixed, b, a), a Mamba-2 mixer's (xbc, dt)) into `saved`, static buffers the host's settle
    reads once acceptance is known."""

    slots: torch.Tensor  # [lanes] int64, on the device
    rows_per_lane: int
    keep: bool
    saved: tuple[tuple[torch.Tensor, ...], ...] = ()  # per linear layer


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
    lane_states: LaneStates | None = field(default=None, compare=False)  # hybrids, graphed

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])


def pack_batch(batch: ForwardBatch) -> dict:
    """A ForwardBatch as plain CPU data for broadcast_object_list."""
    return {
        "input_ids": batch.input_ids.cpu(),
        "positions": batch.positions.cpu(),
        "slot_mapping": batch.slot_mapping.cpu(),
        "seqs": [
            (s.query_start, s.num_queries, s.context_len, s.kv_slots.cpu()) for s in batch.seqs
        ],
        "logits_indices": batch.logits_indices.cpu(),
    }


def unpack_batch(d: dict, device: str) -> ForwardBatch:
    return ForwardBatch(
        input_ids=d["input_ids"].to(device),
        positions=d["positions"].to(device),
        slot_mapping=d["slot_mapping"].to(device),
        seqs=tuple(SeqSlice(qs, nq, cl, sl.to(device)) for qs, nq, cl, sl in d["seqs"]),
        logits_indices=d["logits_indices"].to(device),
    )


def fill_pending(
    input_ids: torch.Tensor,
    first_rows: Sequence[int],
    lanes: Sequence[LaneRows],
    previous_tokens: torch.Tensor | None,
) -> None:
    """Overwrite, on the device, the input rows whose tokens the host does not have: the first
    row of each lane with a `pending_row` (that row of previous_tokens) and the drafts of each
    lane with `draft_rows` (those rows of its `draft_source`). The host never waits for a token
    the device already has."""
    sources: dict[int, tuple[torch.Tensor, list[int], list[int]]] = {}  # id -> (src, rows, from)
    for row, s in zip(first_rows, lanes, strict=True):
        if s.pending_row is not None:
            if previous_tokens is None:
                raise ValueError("steps with pending rows need the previous forward's tokens")
            entry = sources.setdefault(id(previous_tokens), (previous_tokens, [], []))
            entry[1].append(row)
            entry[2].append(s.pending_row)
        if s.draft_source is not None:
            entry = sources.setdefault(id(s.draft_source), (s.draft_source, [], []))
            first_draft = row + s.num_tokens - len(s.draft_rows)
            entry[1].extend(range(first_draft, first_draft + len(s.draft_rows)))
            entry[2].extend(s.draft_rows)
    for source, rows, src in sources.values():
        n = len(rows)
        if rows == src == list(range(n)):  # steady decode: row i reads sample i, one copy
            input_ids[:n].copy_(source[:n])
            continue
        index = torch.tensor([rows, src], dtype=torch.int64).to(input_ids.device, non_blocking=True)
        input_ids.index_copy_(0, index[0], source.index_select(0, index[1]))
