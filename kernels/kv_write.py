"""Write a forward's K and V rows into their slots of the paged KV pool."""

from __future__ import annotations

import torch

from lanes.kernels.common import check
from lanes.kernels.triton_shim import tl, triton


@triton.jit
def _kv_write_kernel(
    k_ptr,  # [T, H*D]
    v_ptr,  # [T, H*D]
    slots_ptr,  # [T] int64
    k_cache_ptr,  # [S, H*D]
    v_cache_ptr,  # [S, H*D]
    HD,
    BLOCK: tl.constexpr,
):
    t = tl.program_id(0)
    i = tl.arange(0, BLOCK)
    mask = i < HD
    slot = tl.load(slots_ptr + t)
    tl.store(k_cache_ptr + slot * HD + i, tl.load(k_ptr + t * HD + i, mask=mask), mask=mask)
    tl.store(v_cache_ptr + slot * HD + i, tl.load(v_ptr + t * HD + i, mask=mask), mask=mask)


def kv_write(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> None:
    """k, v [T, H, D] -> k_cache, v_cache [S, H, D] at slots [T]."""
    check(k.shape == v.shape and k.dim() == 3, "k and v must be [T, H, D]")
    check(
        k_cache.shape[1:] == k.shape[1:] and v_cache.shape == k_cache.shape,
        "cache must be [S, H, D]",
    )
    check(k.dtype == k_cache.dtype == v.dtype == v_cache.dtype, "k, v and caches share one dtype")
    check(slots.dtype == torch.int64 and slots.shape == (k.shape[0],), "slots must be int64 [T]")
    check(k_cache.is_contiguous() and v_cache.is_contiguous(), "caches must be contiguous")
    k, v = k.contiguous(), v.contiguous()
    hd = k.shape[1] * k.shape[2]
    if k.shape[0]:
        _kv_write_kernel[(k.shape[0],)](
            k, v, slots, k_cache, v_cache, hd, BLOCK=triton.next_power_of_2(hd)
        )


def ref_kv_write(k_cache, v_cache, slots, k, v) -> None:
    k_cache.index_copy_(0, slots, k)
    v_cache.index_copy_(0, slots, v)
