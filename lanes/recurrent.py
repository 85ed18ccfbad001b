"""What the engine does for hybrid models' recurrent state: a slot per running lane, rollback
after verification, and snapshots that let a lane resume a cached prefix.

The rule stays the engine's one rule (computed tokens catch up with known tokens); the state
only has to agree with `num_computed`:
- admission: a lane resumes a cached prefix only as far as a snapshot reaches (the longest run
  of matched blocks whose last block has one); its slot is loaded from that snapshot;
- after a prompt chunk whose end is block-aligned (with the chunked DeltaNet form: chunk-aligned
  too), the state there becomes a snapshot, keyed by
  the prompt cache's key of the block ending there — copied right after the chunk's forward is
  launched (in stream order, before the next chunk moves the state), so cancel_prefill, which
  ends the lane between forwards, leaves the latest one (and the blocks up to it, published by
  the engine once that forward has completed) for an identical retry;
- past the prompt, when a step leaves the lane on a block boundary, the state there becomes a
  snapshot too (the engine keys the output's blocks first), replacing the lane's previous
  output snapshot: a next turn, which repeats prompt and answer, resumes at the answer's last
  boundary (a step that jumps a boundary with accepted drafts takes none there);
- after a verify step (which only read the state), the accepted rows are run again to the last
  accepted position (`settle`, the decoder's: it needs the layers' weights);
- release: the slot is freed.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from lanes.cache.state_pool import StatePool
from lanes.cache.state_snapshots import StateSnapshots
from lanes.kernels import chunked_delta as chunked_form
from lanes.lane import Lane

# (pool, slot, num_computed): the slot advanced over a verify step's accepted rows
Settle = Callable[[StatePool, int, int], None]


class RecurrentStates:
    def __init__(
        self,
        pool: StatePool,
        snapshot_bytes: int,
        block_size: int,
        settle: Settle,
        chunked_delta: bool = False,
    ) -> None:
        self.pool = pool
        self._settle = settle
        self.snapshots = StateSnapshots(snapshot_bytes)
        self.block_size = block_size
        # snapshots at block ends; the chunked form's slot carries the current chunk's rows, so
        # there only at chunk ends that are block ends, where those rows are none
        self.stride = math.lcm(block_size, chunked_form.CHUNK) if chunked_delta else block_size

    def resumable(self, keys: list[bytes]) -> int:
        """Of a matched prefix of blocks with these keys, how many a lane can resume."""
        return self.snapshots.longest(keys)

    def admit(self, lane: Lane, num_blocks: int) -> None:
        """Give the lane a slot, holding the state after its first num_blocks blocks."""
        lane.state_slot = self.pool.allocate()
        if num_blocks:
            conv, state = self.snapshots.get(lane.block_keys[num_blocks - 1])
            self.pool.restore(lane.state_slot, conv, state, num_blocks * self.block_size)
            self.snapshots.num_restored += 1

    def after_prefill(self, lane: Lane, position: int | None = None) -> None:
        """The lane's state at a block-aligned `position` (by default num_computed) inside its
        keyed blocks: a snapshot."""
        n, bs = lane.num_computed if position is None else position, self.block_size
        if n == 0 or n % self.stride or n // bs > len(lane.block_keys):
            return
        key = lane.block_keys[n // bs - 1]
        if key in self.snapshots:
            return
        self.snapshots.put(key, *self.pool.snapshot(lane.state_slot))
        if n > len(lane.prompt_ids):  # an output boundary: keep only the lane's latest
            if lane.output_snapshot_key is not None:
                self.snapshots.discard(lane.output_snapshot_key)
            lane.output_snapshot_key = key

    def settle(self, lane: Lane) -> None:
        self._settle(self.pool, lane.state_slot, lane.num_computed)

    def release(self, lane: Lane) -> None:
        self.pool.release(lane.state_slot)
        lane.state_slot = -1

    def check_integrity(self, running: list[Lane]) -> None:
        self.pool.check_integrity([lane.state_slot for lane in running])
