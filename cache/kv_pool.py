"""The KV tensors: one flat slot axis per layer, indexed through block tables."""

from __future__ import annotations

import torch


class KVPool:
    """K and V for every attention layer, `num_blocks * block_size` slots each.

    Layout per layer: k[layer] and v[layer] are [num_slots, num_kv_heads, head_dim]; slot
    `block * block_size + offset` holds one token. Slots never written read as zeros (the pool is
    zero-initialised), so gathering a padded tile never brings NaNs into attention.
    """

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.dtype = dtype
        shape = (num_layers, num_blocks * block_size, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.states = None  # hybrid models: the recurrent-state slots (cache.state_pool)

    @staticmethod
    def bytes_per_block(
        num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        itemsize = torch.empty((), dtype=dtype).element_size()
        return 2 * num_layers * block_size * num_kv_heads * head_dim * itemsize

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v [num_tokens, num_kv_heads, head_dim] at slots [num_tokens]."""
        self.k[layer].index_copy_(0, slots, k)
        self.v[layer].index_copy_(0, slots, v)
