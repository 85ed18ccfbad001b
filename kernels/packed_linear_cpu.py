"""The CPU's packed linear: x @ w.T with w kept as 4- or 8-bit affine codes (lanes.packed),
dequantized in registers by a C kernel (kernels/packed_linear_cpu.c, built at first use by
kernels/native.py). A row's result is the same sequence of float operations whatever the
other rows of the call, so it is batch-invariant like the rest of the exact CPU ops.

`ref_packed_linear` is the same math in plain torch (dequantize, then a float64 matmul): the
kernel's tolerance is measured against it.
"""

from __future__ import annotations

import ctypes
import functools
import sys

import torch

from lanes.kernels.native import load
from lanes.packed import PackedWeight, dequantize


@functools.cache
def _kernel():
    lib = load("packed_linear_cpu.c")
    if lib is None:
        return None
    fn = lib.lanes_packed_linear
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    fn.argtypes = [p, i64, i64, ctypes.c_int, p, p, p, i64, ctypes.c_int, i64, p, p]
    fn.restype = ctypes.c_int
    return fn


def available() -> bool:
    """Whether the C kernel built on this machine."""
    return _kernel() is not None


def takes(weight: PackedWeight) -> bool:
    """Whether the kernel serves this weight here: on the CPU, 4 or 8 bits, groups a multiple
    of 32 (GGUF's blocks, MLX's 32/64/128), float32 scales, a little-endian machine (the codes'
    bytes are read in memory order) and a kernel that built."""
    return (
        weight.device.type == "cpu"
        and weight.bits in (4, 8)
        and weight.group % 32 == 0
        and weight.shape[1] % weight.group == 0
        and weight.scales.dtype == torch.float32
        and sys.byteorder == "little"
        and _kernel() is not None
    )


def packed_linear(
    x: torch.Tensor, weight: PackedWeight, bias: torch.Tensor | None = None, glu: bool = False
) -> torch.Tensor:
    """x [rows, in] float32 @ weight.T (+ bias) -> [rows, out] float32 (`takes(weight)` first).
    glu: x is [rows, 2 * in], gate and up side by side, and the input silu(gate) * up."""
    n, k = weight.shape
    if x.dtype != torch.float32 or x.shape[-1] != (2 * k if glu else k):
        raise ValueError(f"packed linear: x {tuple(x.shape)} {x.dtype}, weight [{n}, {k}]")
    x = x.contiguous()
    m = x.shape[0]
    out = torch.empty((m, n), dtype=torch.float32)
    scratch = torch.empty((m, k), dtype=torch.float32)
    codes, scales, biases = (t.contiguous() for t in (weight.codes, weight.scales, weight.biases))
    status = _kernel()(
        x.data_ptr(), m, k, glu, codes.data_ptr(), scales.data_ptr(), biases.data_ptr(), n,
        weight.bits, weight.group, scratch.data_ptr(), out.data_ptr(),
    )  # fmt: skip
    if status != 0:
        raise ValueError(f"packed linear: {weight.bits} bits, group {weight.group} not taken")
    return out if bias is None else out + bias


def ref_packed_linear(
    x: torch.Tensor, weight: PackedWeight, bias: torch.Tensor | None = None, glu: bool = False
) -> torch.Tensor:
    if glu:
        gate, up = x.chunk(2, dim=-1)
        x = torch.nn.functional.silu(gate) * up
    w = dequantize(weight.codes, weight.scales, weight.biases, weight.bits, weight.group)
    out = (x.double() @ w.double().T).float()
    return out if bias is None else out + bias
