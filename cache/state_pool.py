"""Recurrent state of hybrid models (gated DeltaNet layers): one slot per running lane.

A slot holds, for every linear-attention layer, the causal conv's last `kernel - 1` inputs and
the delta rule's state matrix per value head, in float32. The slot always describes the lane
after position `num_computed - 1`: each forward starts at the lane's num_computed, reads the
slot and writes it back. A forward that starts at position 0 starts from zeros.

Verify forwards run drafts through the recurrent layers too, and rejected drafts must not stay
in the state: for steps marked `keep_states` the pool keeps the state after every row, and
`settle(slot, num_computed)` puts back the one after the last accepted position.

    verify rows at positions 40 41 42 43 (drafts 41..43), 2 drafts accepted -> num_computed 43
    kept: after 40, after 41, after 42, after 43   settle -> the slot holds "after 42"
"""

from __future__ import annotations

import torch


class StatePool:
    def __init__(
        self,
        num_slots: int,
        num_layers: int,
        conv_shape: tuple[int, int],  # [conv channels, kernel - 1]
        state_shape: tuple[int, int, int],  # [value heads, key head dim, value head dim]
        device: torch.device | str,
    ) -> None:
        f32 = dict(dtype=torch.float32, device=device)
        self.conv = torch.zeros((num_slots, num_layers, *conv_shape), **f32)
        self.recurrent = torch.zeros((num_slots, num_layers, *state_shape), **f32)
        self.free = list(range(num_slots - 1, -1, -1))
        # tokens each slot's state has consumed, per layer; and the state before the latest write
        self.positions = [[0] * num_layers for _ in range(num_slots)]
        self.before: dict[tuple[int, int], tuple[int, torch.Tensor, torch.Tensor]] = {}
        # slot -> (position of the first kept row, per layer: (conv rows, state rows))
        self.kept: dict[int, tuple[int, dict[int, tuple[torch.Tensor, torch.Tensor]]]] = {}

    @staticmethod
    def bytes_per_slot(
        num_layers: int, conv_shape: tuple[int, int], state_shape: tuple[int, int, int]
    ) -> int:
        per_layer = conv_shape[0] * conv_shape[1] + state_shape[0] * state_shape[1] * state_shape[2]
        return 4 * num_layers * per_layer

    @property
    def nbytes(self) -> int:
        return self.conv.nbytes + self.recurrent.nbytes

    @property
    def num_slots(self) -> int:
        return self.conv.shape[0]

    @property
    def num_free(self) -> int:
        return len(self.free)

    def allocate(self) -> int:
        if not self.free:
            raise RuntimeError("no recurrent-state slot is free")
        return self.free.pop()

    def release(self, slot: int) -> None:
        if slot < 0:
            return
        if slot in self.free:
            raise AssertionError(f"state slot {slot} released twice")
        self.kept.pop(slot, None)
        for layer in range(len(self.positions[slot])):
            self.before.pop((slot, layer), None)
        self.positions[slot] = [0] * len(self.positions[slot])
        self.free.append(slot)

    def read(self, slot: int, layer: int, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(conv [channels, kernel - 1], state [heads, dk, dv]) after `position` tokens: zeros
        at 0, else the slot's, or the one it held before its latest write when a failed forward
        is run again from the same position. The copies returned are also that backup: the
        caller must not change them in place."""
        if slot < 0:
            raise ValueError("a hybrid model's step needs its lane's state slot")
        if position == 0:
            return torch.zeros_like(self.conv[slot, layer]), torch.zeros_like(
                self.recurrent[slot, layer]
            )
        held = self.positions[slot][layer]
        if held == position:
            conv, state = self.conv[slot, layer].clone(), self.recurrent[slot, layer].clone()
            self.before[(slot, layer)] = (position, conv, state)  # what the next write replaces
            return conv, state
        before = self.before.get((slot, layer))
        if before is not None and before[0] == position:
            return before[1].clone(), before[2].clone()
        raise AssertionError(
            f"state slot {slot} layer {layer} holds position {held}; a step starts at {position}"
        )

    def write(
        self,
        slot: int,
        layer: int,
        position: int,
        conv: torch.Tensor,
        state: torch.Tensor,
        rows: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
        first_position: int = 0,
    ) -> None:
        """The state after `position` tokens (a step's last row); with `rows`, the state after
        each of its rows from first_position on, kept for `settle`."""
        self.conv[slot, layer] = conv
        self.recurrent[slot, layer] = state
        self.positions[slot][layer] = position
        if rows is None:
            self.kept.pop(slot, None)
            return
        start, layers = self.kept.get(slot, (first_position, {}))
        if start != first_position:
            layers = {}
        layers[layer] = (torch.stack([c for c, _ in rows]), torch.stack([s for _, s in rows]))
        self.kept[slot] = (first_position, layers)

    def settle(self, slot: int, num_computed: int) -> None:
        """After verification: the slot holds the state after position num_computed - 1."""
        entry = self.kept.pop(slot, None)
        if entry is None:
            return
        start, layers = entry
        row = num_computed - 1 - start
        for layer, (conv_rows, state_rows) in layers.items():
            if not 0 <= row < len(conv_rows):
                raise AssertionError(
                    f"state slot {slot}: position {num_computed - 1} is not among the kept rows"
                )
            self.conv[slot, layer] = conv_rows[row]
            self.recurrent[slot, layer] = state_rows[row]
            self.positions[slot][layer] = num_computed

    def snapshot(self, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of the slot's whole state (every layer): conv [layers, ...], state [layers, ...]."""
        return self.conv[slot].clone(), self.recurrent[slot].clone()

    def restore(self, slot: int, conv: torch.Tensor, state: torch.Tensor, position: int) -> None:
        """Load a snapshot: the slot now holds the state after `position` tokens."""
        self.conv[slot] = conv
        self.recurrent[slot] = state
        self.positions[slot] = [position] * len(self.positions[slot])
        self.kept.pop(slot, None)

    def check_integrity(self, owned: list[int]) -> None:
        """Every slot is free or owned by exactly one lane."""
        if sorted(self.free + owned) != list(range(self.num_slots)):
            raise AssertionError(f"state slots: free {sorted(self.free)}, owned {sorted(owned)}")
