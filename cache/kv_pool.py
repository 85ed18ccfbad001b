"""The KV tensors: one flat slot axis per layer, indexed through block tables."""

from __future__ import annotations

import numpy as np
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
        self.k = _zeros(shape, dtype, device)
        self.v = _zeros(shape, dtype, device)
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


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """A zeroed tensor. On the CPU through numpy's calloc: the operating system's zero pages,
    so memory is only used where KV is written (torch.zeros writes every byte: a 512 MiB pool
    made 512 MiB of resident memory before the first request)."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    itemsize = torch.empty((), dtype=dtype).element_size()
    nbytes = itemsize * int(np.prod(shape))
    raw = np.zeros(nbytes + 64, dtype=np.uint8)
    start = -raw.ctypes.data % 64  # cache-line aligned, as torch's own allocations are
    return torch.from_numpy(raw[start : start + nbytes]).view(dtype).view(shape)
