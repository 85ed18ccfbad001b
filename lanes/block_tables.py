"""The runner's block tables: every lane's KV blocks by slot, kept on the host and the device.

The scheduler hands the runner LaneRows (lanes/lane_rows.py) that list a lane's blocks; the
runner compares them with what its slot holds and sends the device only the entries that
changed — in steady decode a new block every `block_size` tokens, not the whole table. The
context slots of an eager forward (every position's KV slot, which attention reads) are then
gathered on the device from the table, instead of being listed position by position in Python
and copied lane by lane.

    slot 3 holds blocks (7, 2); rows for slot 3 list (7, 2, 9): one entry, table[3, 2] = 9
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lanes.cache.block_table import BlockTable


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two block lists."""
    n = min(len(a), len(b))
    if list(a[:n]) == list(b[:n]):
        return n
    return next(i for i in range(n) if a[i] != b[i])


class BlockTables:
    def __init__(self, block_size: int, max_blocks: int, device: str, num_slots: int = 8) -> None:
        self.block_size = block_size
        self.max_blocks = max_blocks
        self.device = device
        self.rows: list[BlockTable] = []  # each slot's blocks on the host (a mirror)
        self.table = torch.zeros((0, max_blocks), dtype=torch.int32, device=device)
        self._grow(num_slots)
        # (slot, index) -> block, to send: one value per entry, the latest (the device's scatter
        # of duplicate indices keeps an arbitrary one)
        self._changes: dict[tuple[int, int], int] = {}
        self.entries_sent = 0  # block ids copied to the device so far (tests, benches)

    def _grow(self, num_slots: int) -> None:
        if num_slots <= len(self.rows):
            return
        num_slots = max(num_slots, 2 * len(self.rows))
        table = torch.zeros((num_slots, self.max_blocks), dtype=torch.int32, device=self.device)
        table[: self.table.shape[0]] = self.table
        self.table = table
        self.rows += [BlockTable(self.block_size) for _ in range(num_slots - len(self.rows))]

    def row(self, slot: int) -> BlockTable:
        return self.rows[slot]

    def sync(self, slot: int, blocks: Sequence[int]) -> None:
        """Slot `slot` now holds `blocks`; the changed entries are queued for the device."""
        if len(blocks) > self.max_blocks:
            raise IndexError(
                f"{len(blocks)} blocks for one lane; the table holds {self.max_blocks}"
            )
        self._grow(slot + 1)
        row = self.rows[slot]
        keep = common_prefix(row.blocks, blocks)
        if keep == len(blocks) == len(row.blocks):
            return
        row.truncate(keep * self.block_size)
        row.append(list(blocks[keep:]))
        for i in range(keep, len(blocks)):
            self._changes[(slot, i)] = blocks[i]

    def flush(self) -> None:
        """Send the queued entries in one copy (never a blocking one: a forward may be in
        flight)."""
        if not self._changes:
            return
        entries = [(slot, i, block) for (slot, i), block in self._changes.items()]
        staged = torch.tensor(entries, dtype=torch.int64).T.contiguous()
        staged = staged.to(self.device, non_blocking=True)
        self.table.index_put_((staged[0], staged[1]), staged[2].to(torch.int32))
        self.entries_sent += len(entries)
        self._changes = {}

    def context_slots(self, contexts: Sequence[tuple[int, int]]) -> torch.Tensor:
        """The KV slot of every position [0, ctx) of each (slot, ctx), one after another
        [sum of ctx] int64, gathered on the device from the table."""
        self.flush()
        total = sum(ctx for _, ctx in contexts)
        offsets, at = [], 0
        for _, ctx in contexts:
            offsets.append(at)
            at += ctx
        staged = torch.tensor(
            [[s for s, _ in contexts], [c for _, c in contexts], offsets], dtype=torch.int64
        ).to(self.device, non_blocking=True)
        slots, lengths, starts = staged
        seq = torch.repeat_interleave(
            torch.arange(len(contexts), device=self.device), lengths, output_size=total
        )
        pos = torch.arange(total, device=self.device) - starts[seq]
        bs = self.block_size
        return self.table[slots[seq], pos // bs].long() * bs + pos % bs
