"""A checkpoint opened but not yet loaded: its config, tensor shapes, a loader, and its tokenizer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from lanes.config import ModelConfig
    from lanes.packed import PackedWeight
    from lanes.tokenizer import Tokenizer


@dataclass(frozen=True)
class Checkpoint:
    config: ModelConfig
    shapes: dict[str, tuple[int, ...]]  # HF tensor name -> shape, read without loading data
    load: Callable[[str], torch.Tensor]  # HF tensor name -> tensor (any float dtype, on the CPU)
    tokenizer: Tokenizer
    source: str  # what was opened, for logs
    fingerprint: str  # identifies these exact weights (prompt-cache keys depend on it)
    # quantized checkpoints: HF tensor name -> the weight as its codes (None: a float tensor)
    packed: Callable[[str], PackedWeight | None] | None = None

    def first_layers(self, num_layers: int) -> Checkpoint:
        """This checkpoint cut to its first num_layers layers (a weak drafter, for tests and
        benchmarks): the same embedding, final norm and LM head."""
        import dataclasses

        def kept(name: str) -> bool:
            return not name.startswith("model.layers.") or int(name.split(".")[2]) < num_layers

        return dataclasses.replace(
            self,
            config=dataclasses.replace(self.config, num_layers=num_layers),
            shapes={k: v for k, v in self.shapes.items() if kept(k)},
        )
