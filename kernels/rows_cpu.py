"""The CPU's row-wise layer steps in C (kernels/rows_cpu.c, built at first use by
kernels/native.py): the residual add with its RMSNorm, and RoPE with the KV write, one call
each. Every row is computed alone by the same operations, so these are batch-invariant like
the torch forms they replace in ExactOps (lanes.ops.rms_norm, Ops.rope / write_kv), which are
their references and stay for other dtypes and machines without a compiler.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from lanes.kernels.native import load


@functools.cache
def _lib():
    lib = load("rows_cpu.c")
    if lib is None:
        return None
    p, i64, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
    lib.lanes_rms_norm.argtypes = [p, p, i64, i64, p, f32, p, p]
    lib.lanes_rope_write.argtypes = [p, i64, p, p, i64, i64, i64, i64, i64, i64, p, p, p, p, p, p]
    for fn in (lib.lanes_rms_norm, lib.lanes_rope_write):
        fn.restype = ctypes.c_int
    return lib


def _float32_cpu(*tensors: torch.Tensor) -> bool:
    return all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors)


def takes_norm(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return x.dim() == 2 and x.shape[-1] % 16 == 0 and _float32_cpu(x, weight) and _lib() is not None


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(s, weight * (s * rsqrt(mean(s^2) + eps))) over the last dim, s = x (+ residual);
    x [rows, dim] (`takes_norm` first)."""
    rows, dim = x.shape
    x, weight = x.contiguous(), weight.contiguous()
    out = torch.empty_like(x)
    summed = None
    if residual is not None:
        residual = residual.contiguous()
        summed = torch.empty_like(x)
    _lib().lanes_rms_norm(
        x.data_ptr(), None if residual is None else residual.data_ptr(), rows, dim,
        weight.data_ptr(), eps, None if summed is None else summed.data_ptr(), out.data_ptr(),
    )  # fmt: skip
    return (x if summed is None else summed), out


def takes_rope_write(q, k, v, cos, k_cache, rope_dim: int) -> bool:
    """q, k, v [T, H, D] column views of one projection (rows apart by any stride, heads D
    apart), k and v alike; contiguous float32 caches and tables cos, sin [T, rope_dim / 2]."""
    d = q.shape[-1]
    return (
        _float32_cpu(q, k, v, cos, k_cache)
        and all(t.stride(2) == 1 and t.stride(1) == d for t in (q, k, v))
        and k.stride(0) == v.stride(0)
        and tuple(cos.shape) == (q.shape[0], rope_dim // 2)
        and cos.is_contiguous()
        and k_cache.is_contiguous()
        and rope_dim % 2 == 0
        and rope_dim <= d
        and _lib() is not None
    )


def rope_write(q, k, v, cos, sin, k_cache, v_cache, slots, rope_dim: int) -> torch.Tensor:
    """RoPE on q and k (their first rope_dim dims), k and v written at slots; returns q
    rotated, [T, HQ, D] (`takes_rope_write` first)."""
    tokens, heads, d = q.shape
    q_out = torch.empty((tokens, heads, d), dtype=torch.float32)
    slots = slots.to(torch.int64).contiguous()
    sin = sin.contiguous()
    _lib().lanes_rope_write(
        q.data_ptr(), q.stride(0), k.data_ptr(), v.data_ptr(), k.stride(0), tokens, heads,
        k.shape[1], d, rope_dim, cos.data_ptr(), sin.data_ptr(), slots.data_ptr(),
        q_out.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(),
    )  # fmt: skip
    return q_out
