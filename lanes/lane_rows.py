"""LaneRows: one lane's rows in one forward, as the runner takes them — plain data.

The scheduler (the engine, or a drafter for its own model) plans with `rounds.Step`, which
carries the lane it belongs to; at the runner's door each step becomes LaneRows, which name the
lane only by its slot (its row in the runner's BlockTables) and say what the forward needs:
positions, the ids of its tokens, the blocks its context lives in, and where on the device the
tokens the host does not have yet come from. The runner never reads a Lane.

    Step(lane, start=41, end=45, draft_ids=(d1, d2, d3), num_logits=4)
    -> LaneRows(slot=3, start=41, end=45, token_ids=(t41, d1, d2, d3), blocks=(7, 2, 9), ...)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from lanes.cache.block_table import BlockTable


@dataclass(frozen=True)
class LaneRows:
    slot: int  # the lane's row in the runner's block tables
    start: int  # positions [start, end)
    end: int
    token_ids: tuple[int, ...]  # ids at [start, end); 0 where the device fills one in
    blocks: tuple[int, ...]  # the lane's KV blocks in order: [0, end) and any reserved past it
    num_logits: int = 0  # trailing rows that yield next-token logits
    # the first token is row `pending_row` of the previous forward's samples (overlap)
    pending_row: int | None = None
    # the last len(draft_rows) tokens are those rows of `draft_source` (drafts on the device)
    draft_rows: tuple[int, ...] = ()
    draft_source: torch.Tensor | None = field(default=None, compare=False, repr=False)
    # [num_tokens, hidden]: target features the rows read (EAGLE-style drafters only)
    features: torch.Tensor | None = field(default=None, compare=False, repr=False)
    state_slot: int = -1  # hybrid models: the lane's recurrent-state slot
    # a draft branch (lanes/branch_scratch.py): rows of branch `branch` > 0 keep the KV of
    # positions from `fork` on in that branch's scratch slots, not the lane's blocks, and read
    # positions before `fork` from the lane's blocks: a sibling's rows are never seen
    branch: int = 0
    fork: int = 0

    @property
    def num_tokens(self) -> int:
        return self.end - self.start

    @property
    def keep_states(self) -> bool:
        """Hybrids keep the state after every row of a verify step (trailing rows may be
        rejected)."""
        return self.num_logits > 1


class RowSource(Protocol):
    """What rows are built from: a lane, or a drafter's shadow of one (its own blocks)."""

    slot: int
    block_table: BlockTable

    @property
    def num_known(self) -> int: ...

    def token_ids(self, start: int, end: int) -> list[int]: ...


def rows_of(
    source: RowSource,
    start: int,
    end: int,
    *,
    num_logits: int = 0,
    draft_ids: tuple[int, ...] = (),
    pending_row: int | None = None,
    draft_rows: tuple[int, ...] = (),
    draft_source: torch.Tensor | None = None,
    features: torch.Tensor | None = None,
    branch: int = 0,
    fork: int = 0,
) -> LaneRows:
    """Positions [start, end) of `source`: its known tokens, then `draft_ids`; a pending first
    token and device drafts read 0 (the runner fills them in)."""
    ids = source.token_ids(start, min(end, source.num_known)) + list(draft_ids)
    if draft_source is not None:
        ids += [0] * len(draft_rows)
    if pending_row is not None:
        ids = [0, *ids]
    if len(ids) != end - start:
        raise ValueError(f"rows [{start}, {end}) have {len(ids)} tokens")
    return LaneRows(
        slot=source.slot,
        start=start,
        end=end,
        token_ids=tuple(ids),
        blocks=tuple(source.block_table.blocks),
        num_logits=num_logits,
        pending_row=pending_row,
        draft_rows=draft_rows,
        draft_source=draft_source,
        features=features,
        state_slot=getattr(source, "state_slot", -1),  # drafters' shadows have none
        branch=branch,
        fork=fork,
    )
