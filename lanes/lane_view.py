"""What a drafter is given of a lane: a read-only view — its id, slot, sampling parameters,
progress and a view of its tokens — never the lane's scheduling state (lanes/lane.py), which
only the engine's parts change. `Lane` satisfies `LaneView` as it is; a drafter keeps its own
progress in a shadow of its own.

`Chunk` is a prompt chunk the target just computed, which a drafter with its own model computes
too, in the same round.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from lanes.sampling import SamplingParams


class LaneView(Protocol):
    @property
    def request_id(self) -> int: ...

    @property
    def slot(self) -> int: ...  # its row in the block tables (a drafter's runner uses it too)

    @property
    def params(self) -> SamplingParams: ...

    @property
    def prompt_ids(self) -> list[int]: ...

    @property
    def num_known(self) -> int: ...  # prompt + accepted output

    @property
    def num_computed(self) -> int: ...  # positions the target has settled

    @property
    def block_keys(self) -> list[bytes]: ...  # prompt-cache keys of its whole blocks

    def token_ids(self, start: int, end: int) -> list[int]: ...

    def all_ids(self) -> list[int]: ...


@dataclass(frozen=True)
class Chunk:
    """Positions [start, end) of a lane's known tokens, computed by the target's forward."""

    lane: LaneView
    start: int
    end: int
