"""Recurrent state of hybrid models (gated DeltaNet layers): one slot per running lane.

A slot holds, for every linear-attention layer, the causal conv's last `kernel - 1` inputs and
the delta rule's state matrix per value head, in float32. The slot always describes the lane
after position `positions - 1`: each forward starts at the lane's num_computed, reads the slot
and writes it back. A forward that starts at position 0 starts from zeros. One slot more than
the lanes is the scratch slot, which CUDA-graph padding lanes read and write.

Verify forwards run drafts through the recurrent layers too, and rejected drafts must not reach
the state: a step marked `keep_states` leaves the slot where it was and records each layer's
inputs to the recurrence (`defer`); once acceptance is known, the engine's settle runs the
accepted rows again from the slot (the same per-row arithmetic, so the same bits as the verify
forward computed) and writes the state after the last accepted position.

    verify rows at positions 40 41 42 43 (drafts 41..43): the slot stays "after 39"
    2 drafts accepted -> num_computed 43: settle runs rows 40 41 42 -> the slot holds "after 42"
"""

from __future__ import annotations

from collections.abc import Mapping

import torch


class StatePool:
    def __init__(
        self,
        num_slots: int,
        num_layers: int,
        conv_shape: tuple[int, int],  # [conv channels, kernel - 1]
        # DeltaNet: [value heads, dk, dv]; Mamba-2: [heads, head_dim, state]
        state_shape: tuple[int, int, int],
        device: torch.device | str,
        deferred_widths: tuple[int, ...] = (),  # a verify row's saved inputs, per layer
    ) -> None:
        f32 = dict(dtype=torch.float32, device=device)
        self.deferred_widths = deferred_widths
        self.conv = torch.zeros((num_slots + 1, num_layers, *conv_shape), **f32)
        self.recurrent = torch.zeros((num_slots + 1, num_layers, *state_shape), **f32)
        self.scratch_slot = num_slots
        self.free = list(range(num_slots - 1, -1, -1))
        # tokens each slot's state has consumed, per layer; and the state before the latest write
        self.positions = [[0] * num_layers for _ in range(num_slots)]
        self.before: dict[tuple[int, int], tuple[int, torch.Tensor, torch.Tensor]] = {}
        # slot -> (first position of its verify step, per layer: the rows' saved inputs)
        self.pending: dict[int, tuple[int, Mapping[int, tuple[torch.Tensor, ...]]]] = {}

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
        return self.scratch_slot

    @property
    def num_layers(self) -> int:
        return self.conv.shape[1]

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
        self.pending.pop(slot, None)
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
        self, slot: int, layer: int, position: int, conv: torch.Tensor, state: torch.Tensor
    ) -> None:
        """The state after `position` tokens."""
        self.conv[slot, layer] = conv
        self.recurrent[slot, layer] = state
        self.positions[slot][layer] = position

    def defer(self, slot: int, layer: int, position: int, inputs: tuple[torch.Tensor, ...]) -> None:
        """A verify step from `position` read the layer's state and left it there; `inputs`
        (its rows' mixed, b, a) are what settling runs again for the accepted rows."""
        start, layers = self.pending.get(slot, (position, {}))
        if start != position:
            layers = {}
        layers[layer] = inputs
        self.pending[slot] = (position, layers)

    def defer_all(self, slot: int, position: int, layers) -> None:
        """As defer, for every layer at once: `layers[j]` gives layer j's (mixed, b, a) rows
        (a CUDA graph's saved buffers, sliced only when settled)."""
        self.pending[slot] = (position, layers)

    def check_position(self, slot: int, position: int) -> None:
        """A forward that reads the slot in place (a CUDA graph) starts at `position`: every
        layer must hold it, and at 0 the slot is cleared (a released slot keeps old values)."""
        if slot < 0:
            raise ValueError("a hybrid model's step needs its lane's state slot")
        if position == 0:
            self.conv[slot].zero_()
            self.recurrent[slot].zero_()
            return
        held = self.positions[slot]
        for layer in (j for j, p in enumerate(held) if p != position):
            before = self.before.get((slot, layer))  # a failed eager forward wrote this layer
            if before is None or before[0] != position:
                raise AssertionError(
                    f"state slot {slot} holds positions {held}; a step starts at {position}"
                )
            self.write(slot, layer, position, before[1], before[2])

    def advanced(self, slot: int, position: int) -> None:
        """Every layer of the slot now holds `position` (a CUDA graph wrote it in place; no
        backup of the state before is kept)."""
        self.positions[slot] = [position] * self.num_layers
        for layer in range(self.num_layers):
            self.before.pop((slot, layer), None)
        self.pending.pop(slot, None)

    def snapshot(self, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of the slot's whole state (every layer): conv [layers, ...], state [layers, ...]."""
        return self.conv[slot].clone(), self.recurrent[slot].clone()

    def restore(self, slot: int, conv: torch.Tensor, state: torch.Tensor, position: int) -> None:
        """Load a snapshot: the slot now holds the state after `position` tokens."""
        self.conv[slot] = conv
        self.recurrent[slot] = state
        self.positions[slot] = [position] * len(self.positions[slot])
        self.pending.pop(slot, None)

    def check_integrity(self, owned: list[int]) -> None:
        """Every slot is free or owned by exactly one lane."""
        if sorted(self.free + owned) != list(range(self.num_slots)):
            raise AssertionError(f"state slots: free {sorted(self.free)}, owned {sorted(owned)}")
