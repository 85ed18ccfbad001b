"""The CPU's exact attention: a C kernel (kernels/attention_cpu.c, built at first use by
kernels/native.py) that gives each (query, head) its softmax over the keys up to its position,
accumulated key by key in ascending position, so prefill, decode and verify agree bitwise and a
query never depends on the rest of the batch. One call per lane instead of the ~20 torch ops
per layer of lanes.attention.exact_attention (which stays: other dtypes, head sizes and
machines without a compiler).

The reference of the same math is lanes.attention.sdpa_attention (the tolerance is measured
against it).
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from lanes.kernels.native import load

MAX_HEAD_DIM = 256  # as in the C source


@functools.cache
def _kernel():
    lib = load("attention_cpu.c")
    if lib is None:
        return None
    fn = lib.lanes_attention
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    fn.argtypes = [p, i64, i64, i64, i64, p, p, p, i64, ctypes.c_float, p]
    fn.restype = ctypes.c_int
    return fn


def available() -> bool:
    return _kernel() is not None


@dataclass(frozen=True)
class LaneRows:
    """What the kernel needs of a forward's lanes, built once per forward (ExactOps.prepare)
    rather than in each layer: per lane (first query row, queries, first position, the address
    of its context's KV slots), the int64 slot tensors kept alive here."""

    lanes: tuple[tuple[int, int, int, int], ...]
    slots: tuple[torch.Tensor, ...]

    @classmethod
    def of(cls, lanes: Sequence[tuple[int, int, int, torch.Tensor]]) -> LaneRows:
        """lanes: per lane (first query row, queries, first position, its KV slots [context])."""
        slots = tuple(kv_slots.to(torch.int64).contiguous() for *_, kv_slots in lanes)
        rows = tuple(
            (start, num_queries, first_position, t.data_ptr())
            for (start, num_queries, first_position, _), t in zip(lanes, slots, strict=True)
        )
        return cls(rows, slots)


def takes(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """Whether the kernel serves these: float32 on the CPU, a head size that is a multiple of
    16 up to 256, query heads a multiple of the KV heads, contiguous caches, a kernel built."""
    d = q.shape[-1]
    return (
        _kernel() is not None
        and q.dtype == k_cache.dtype == v_cache.dtype == torch.float32
        and q.device.type == "cpu"
        and d % 16 == 0
        and d <= MAX_HEAD_DIM
        and q.shape[1] % k_cache.shape[1] == 0
        and k_cache.is_contiguous()
        and v_cache.is_contiguous()
    )


def attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: LaneRows
) -> torch.Tensor:
    """q [num_tokens, heads, d]; caches [slots, kv_heads, d] -> [num_tokens, heads, d]
    (`takes(q, k_cache, v_cache)` first); meta: the forward's lanes (LaneRows.of)."""
    _, heads, d = q.shape
    q = q.contiguous()
    out = torch.empty_like(q)
    row_bytes = heads * d * 4
    q_ptr, out_ptr, k_ptr, v_ptr = (
        q.data_ptr(),
        out.data_ptr(),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
    )
    kernel, kv_heads, scale = _kernel(), k_cache.shape[1], d**-0.5
    for start, num_queries, first_position, slots in meta.lanes:
        offset = start * row_bytes
        status = kernel(
            q_ptr + offset, num_queries, heads, kv_heads, d, k_ptr, v_ptr, slots,
            first_position, scale, out_ptr + offset,
        )  # fmt: skip
        if status != 0:
            raise MemoryError if status == -2 else ValueError(f"attention: q {tuple(q.shape)}")
    return out
