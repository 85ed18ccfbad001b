"""A lane's block table: the KV blocks that hold its tokens, in position order."""

from __future__ import annotations


class BlockTable:
    """Maps a lane's token positions to slots of the KV pool.

    With block_size 4 and blocks [7, 2, 9], positions map to slots (block * block_size + offset):

        position:  0  1  2  3 | 4  5  6  7 | 8  9 10 11
        block:     7          | 2          | 9
        slot:     28 29 30 31 | 8  9 10 11 |36 37 38 39

    The table only records ids; the pool owns them (see BlockPool). It keeps the slot of every
    position it can hold, so that `slots` (asked for a lane's whole context at every decode
    step) is a list slice rather than a per-position computation in Python.
    """

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.blocks: list[int] = []
        self._slots: list[int] = []  # slot of each position < capacity

    @property
    def capacity(self) -> int:
        return len(self.blocks) * self.block_size

    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks to add so that `num_tokens` tokens fit."""
        need = -(-num_tokens // self.block_size)
        return max(0, need - len(self.blocks))

    def append(self, blocks: list[int]) -> None:
        bs = self.block_size
        self.blocks.extend(blocks)
        for b in blocks:
            self._slots.extend(range(b * bs, (b + 1) * bs))

    def slots(self, start: int, end: int) -> list[int]:
        """Slots of positions [start, end); all must be within capacity."""
        if end > self.capacity:
            raise IndexError(f"positions up to {end} with capacity {self.capacity}")
        return self._slots[start:end]

    def truncate(self, num_tokens: int) -> list[int]:
        """Keep the blocks that hold positions < num_tokens; return the others (to release)."""
        keep = -(-num_tokens // self.block_size)
        surplus, self.blocks = self.blocks[keep:], self.blocks[:keep]
        del self._slots[keep * self.block_size :]
        return surplus

    def clear(self) -> list[int]:
        """Forget every block and return them (for the caller to release)."""
        blocks, self.blocks = self.blocks, []
        self._slots = []
        return blocks
