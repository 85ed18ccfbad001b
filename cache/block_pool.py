"""The block pool: which KV blocks are free and how many lanes own each of the others."""

from __future__ import annotations

from collections import deque


class IntegrityError(AssertionError):
    """The pool's bookkeeping contradicts itself: a bug, never a user error."""


class BlockPool:
    """A fixed set of `num_blocks` KV blocks, handed out by reference count.

    Contract:
    - `allocate(n)` returns `n` distinct free blocks, each with refcount 1, in free-list order
      (lowest ids first on a new pool; freed blocks go to the back). Ask `num_free` first: asking
      for more than is free is a caller bug and raises.
    - `incref(b)` adds an owner to an owned block (a lane sharing another's prefix).
    - `release(blocks)` drops one owner from each; a block whose count reaches zero goes to the
      back of the free list, in the order given, so reuse order is predictable.
    - `check_integrity()` verifies free + owned == total, no block both free and owned, no duplicate
      in the free list, and no negative count.
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        self.num_blocks = num_blocks
        self._free: deque[int] = deque(range(num_blocks))
        self._refcount = [0] * num_blocks

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def refcount(self, block: int) -> int:
        return self._refcount[block]

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise IntegrityError(f"asked for {n} blocks with {len(self._free)} free")
        blocks = [self._free.popleft() for _ in range(n)]
        for b in blocks:
            self._refcount[b] = 1
        return blocks

    def incref(self, block: int) -> None:
        if self._refcount[block] <= 0:
            raise IntegrityError(f"incref of free block {block}")
        self._refcount[block] += 1

    def release(self, blocks: list[int]) -> None:
        for b in blocks:
            if self._refcount[b] <= 0:
                raise IntegrityError(f"release of free block {b}")
            self._refcount[b] -= 1
            if self._refcount[b] == 0:
                self._free.append(b)

    def check_integrity(self) -> None:
        free = set(self._free)
        if len(free) != len(self._free):
            raise IntegrityError("a block appears twice in the free list")
        owned = {b for b, c in enumerate(self._refcount) if c > 0}
        if any(c < 0 for c in self._refcount):
            raise IntegrityError("negative reference count")
        if free & owned:
            raise IntegrityError(f"blocks both free and owned: {sorted(free & owned)[:8]}")
        if len(free) + len(owned) != self.num_blocks:
            raise IntegrityError(
                f"free ({len(free)}) + owned ({len(owned)}) != total ({self.num_blocks})"
            )
