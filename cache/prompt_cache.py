"""The prompt cache: completed KV blocks, addressed by content, kept within a byte budget."""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Iterable

from lanes.cache.block_pool import BlockPool, IntegrityError


class PromptCache:
    """Content-addressed KV blocks living in the one block pool.

    A block's key hashes (model fingerprint, cache salt, the block's token ids, the previous
    block's key), so equal keys mean equal prefixes up to and including that block.

    Contract:
    - The cache holds one reference on each block it keeps; lanes hold the others. A cached block
      no lane owns is *evictable*; eviction is LRU (least recently published or released first).
    - `match(keys)` returns the blocks of the longest cached prefix of `keys` and adds a reference
      for the caller (the lane now shares them; they stop being evictable).
    - `publish(key, block)` keeps a block the caller owns and has *completely computed* (the
      forward that wrote its KV has finished). A key already cached is left as it is. The cache
      never holds more than `max_blocks` (its byte budget); to publish when full it evicts, and if
      nothing is evictable it declines.
    - `release(blocks)` drops a lane's references; cached blocks left unowned become evictable.
    - `allocate(n)` takes free blocks, evicting as many unowned cached blocks as needed;
      `num_available` = free + evictable is what may be asked for.
    """

    def __init__(self, pool: BlockPool, fingerprint: str, max_blocks: int) -> None:
        self.pool = pool
        self.fingerprint = fingerprint.encode()
        self.max_blocks = max_blocks
        self._block_of: dict[bytes, int] = {}
        self._key_of: dict[int, bytes] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()  # LRU first
        self.num_evicted = 0

    @property
    def num_cached(self) -> int:
        return len(self._key_of)

    @property
    def num_available(self) -> int:
        return self.pool.num_free + len(self._evictable)

    def is_cached(self, block: int) -> bool:
        return block in self._key_of

    def chain_keys(
        self, tokens: list[int], block_size: int, salt: str, keys: list[bytes]
    ) -> list[bytes]:
        """Extend `keys` (the keys of the first len(keys) blocks) to every full block of tokens."""
        keys = list(keys)
        for b in range(len(keys), len(tokens) // block_size):
            h = hashlib.sha256()
            h.update(self.fingerprint)
            h.update(salt.encode())
            h.update(keys[-1] if keys else b"")
            h.update(array("q", tokens[b * block_size : (b + 1) * block_size]).tobytes())
            keys.append(h.digest())
        return keys

    def num_matching(self, keys: list[bytes]) -> int:
        """How many leading keys are cached (a probe: takes no reference)."""
        n = 0
        while n < len(keys) and keys[n] in self._block_of:
            n += 1
        return n

    def match(self, keys: list[bytes]) -> list[int]:
        blocks = []
        for key in keys:
            block = self._block_of.get(key)
            if block is None:
                break
            blocks.append(block)
        for block in blocks:
            self.pool.incref(block)
            self._evictable.pop(block, None)
        return blocks

    def publish(self, key: bytes, block: int) -> bool:
        """Keep `block` under `key`; returns whether it is now cached under that key."""
        if key in self._block_of:
            return self._block_of[key] == block
        if block in self._key_of:  # already cached under another key: a caller bug
            raise IntegrityError(f"block {block} published twice")
        if self.num_cached >= self.max_blocks and not self._evict_one():
            return False
        self.pool.incref(block)
        self._block_of[key] = block
        self._key_of[block] = key
        return True

    def release(self, blocks: Iterable[int]) -> None:
        blocks = list(blocks)
        self.pool.release(blocks)
        for block in blocks:
            if block in self._key_of and self.pool.refcount(block) == 1:
                self._evictable[block] = None
                self._evictable.move_to_end(block)

    def allocate(self, n: int) -> list[int]:
        while self.pool.num_free < n and self._evict_one():
            pass
        return self.pool.allocate(n)

    def _evict_one(self) -> bool:
        if not self._evictable:
            return False
        block, _ = self._evictable.popitem(last=False)
        del self._block_of[self._key_of.pop(block)]
        self.pool.release([block])
        self.num_evicted += 1
        return True

    def clear(self) -> None:
        """Evict everything evictable."""
        while self._evict_one():
            pass

    def check_integrity(self, lane_blocks: Iterable[list[int]]) -> None:
        """Every block's refcount equals its lane owners plus one if cached; free blocks have
        none; the budget holds; the evictable set is exactly the cached blocks no lane owns."""
        self.pool.check_integrity()
        owners = [0] * self.pool.num_blocks
        for blocks in lane_blocks:
            for b in blocks:
                owners[b] += 1
        for b in range(self.pool.num_blocks):
            want = owners[b] + (1 if b in self._key_of else 0)
            if self.pool.refcount(b) != want:
                raise IntegrityError(
                    f"block {b}: refcount {self.pool.refcount(b)}, but {owners[b]} lane owners"
                    f" and cached={b in self._key_of}"
                )
        if self.num_cached > self.max_blocks:
            raise IntegrityError(f"cache holds {self.num_cached} blocks > budget {self.max_blocks}")
        unowned = {b for b in self._key_of if owners[b] == 0}
        if unowned != set(self._evictable):
            raise IntegrityError("evictable set differs from the cached blocks no lane owns")
        if {self._block_of[k] for k in self._block_of} != set(self._key_of):
            raise IntegrityError("key and block maps disagree")
