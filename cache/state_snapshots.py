"""Recurrent-state snapshots for the prompt cache (hybrid models).

A hybrid lane can resume a cached prefix only if, besides the prefix's KV blocks, it finds the
recurrent state after that prefix. A snapshot is that state (every linear-attention layer's conv
window and state matrix) after a block-aligned position p, keyed by the prompt cache's key of
the block that ends at p: the key chains every token before it, so a snapshot matches exactly
the prefixes its blocks match. Least recently used snapshots go first past `max_bytes`.

    blocks   [k0][k1][k2][k3]          (16 tokens each)
    snapshots      k1      k3          taken at prefill chunk ends 32 and 64
    a prompt matching k0..k3 resumes at 64; one matching k0..k2 resumes at 32

Past its prompt, a lane keeps one snapshot, at the latest block boundary its output reached (a
next turn repeats prompt and answer, so it resumes there).
"""

from __future__ import annotations

from collections import OrderedDict

import torch


class StateSnapshots:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._entries: OrderedDict[bytes, tuple[torch.Tensor, torch.Tensor]] = OrderedDict()
        self.num_taken = 0
        self.num_restored = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: bytes) -> bool:
        return key in self._entries

    def put(self, key: bytes, conv: torch.Tensor, state: torch.Tensor) -> None:
        """Keep copies the caller will not write again (StatePool.snapshot makes them)."""
        size = conv.numel() * conv.element_size() + state.numel() * state.element_size()
        if size > self.max_bytes or key in self._entries:
            return
        while self.nbytes + size > self.max_bytes:
            _, (c, s) = self._entries.popitem(last=False)
            self.nbytes -= c.numel() * c.element_size() + s.numel() * s.element_size()
        self._entries[key] = (conv, state)
        self.nbytes += size
        self.num_taken += 1

    def discard(self, key: bytes) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            c, s = entry
            self.nbytes -= c.numel() * c.element_size() + s.numel() * s.element_size()

    def get(self, key: bytes) -> tuple[torch.Tensor, torch.Tensor] | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def longest(self, keys: list[bytes]) -> int:
        """The most leading blocks of `keys` whose end has a snapshot (0: none)."""
        return next((n for n in range(len(keys), 0, -1) if keys[n - 1] in self._entries), 0)
