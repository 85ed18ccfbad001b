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
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    fn.argtypes = [p, i64, i64, i32, p, p, p, i64, i32, i64, p]
    fn.restype = i32
    return fn


def available() -> bool:
    """Whether the C kernel built on this machine."""
    return _kernel() is not None


def takes(weight: PackedWeight) -> bool:
    """Whether the kernel serves this weight here: on the CPU, 4 or 8 bits, groups a multiple
    of 32 (GGUF's blocks, MLX's 32/64/128), float32 scales, a little-endian machine (the codes'
    bytes are read in memory order) and a kernel that built. Decided once per weight."""
    taken = weight.prepared.get("cpu")
    if taken is None:
        taken = weight.prepared["cpu"] = _arguments(weight) if _takes(weight) else False
    return taken is not False


def _takes(weight: PackedWeight) -> bool:
    return (
        weight.device.type == "cpu"
        and weight.bits in (4, 8)
        and weight.group % 32 == 0
        and weight.shape[1] % weight.group == 0
        and weight.scales.dtype == torch.float32
        and sys.byteorder == "little"
        and _kernel() is not None
    )


def _arguments(weight: PackedWeight) -> tuple:
    """The weight's part of every call: its tensors (kept alive here) and their addresses."""
    tensors = tuple(t.contiguous() for t in (weight.codes, weight.scales, weight.biases))
    n, k = weight.shape
    return tensors, (n, k, weight.bits, weight.group, *(t.data_ptr() for t in tensors))


def packed_linear(
    x: torch.Tensor, weight: PackedWeight, bias: torch.Tensor | None = None, glu: bool = False
) -> torch.Tensor:
    """x [rows, in] float32 @ weight.T (+ bias) -> [rows, out] float32 (`takes(weight)` first).
    glu: x is [rows, 2 * in], gate and up side by side, and the input silu(gate) * up."""
    prepared = weight.prepared.get("cpu")
    if not prepared:
        if not takes(weight):
            raise ValueError(f"packed linear: the CPU kernel does not take {weight.bits} bits")
        prepared = weight.prepared["cpu"]
    _, (n, k, bits, group, codes, scales, biases) = prepared
    if x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] != (2 * k if glu else k):
        raise ValueError(f"packed linear: x {tuple(x.shape)} {x.dtype}, weight [{n}, {k}]")
    if not x.is_contiguous():
        x = x.contiguous()
    m = x.shape[0]
    out = torch.empty((m, n), dtype=torch.float32)
    status = _kernel()(
        x.data_ptr(), m, k, glu, codes, scales, biases, n, bits, group, out.data_ptr()
    )
    if status != 0:
        raise MemoryError if status == -2 else ValueError(f"packed linear: {bits} bits, {group}")
    return out if bias is None else out + bias


def takes_float(weight: torch.Tensor) -> bool:
    """Whether the kernel serves this float32 weight [n, k] as it is (k a multiple of 32; the
    kernel built; a CPU tensor laid out row after row)."""
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and weight.dim() == 2
        and weight.shape[1] % 32 == 0
        and weight.is_contiguous()
        and _kernel() is not None
    )


def float_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, glu: bool = False
) -> torch.Tensor:
    """x [rows, in] float32 @ weight.T (+ bias) through the same kernel (`takes_float` first):
    each row's sum the kernel's fixed sequence, the rows sharing each chunk of the weight, so a
    row's bits never depend on the call's other rows and the weight is read once per 6 rows
    (a BLAS row tile reads it once per tile). glu as in `packed_linear`."""
    n, k = weight.shape
    if x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] != (2 * k if glu else k):
        raise ValueError(f"float linear: x {tuple(x.shape)} {x.dtype}, weight [{n}, {k}]")
    x = x.contiguous()
    out = torch.empty((x.shape[0], n), dtype=torch.float32)
    status = _kernel()(
        x.data_ptr(), x.shape[0], k, glu, weight.data_ptr(), None, None, n, 32, k, out.data_ptr()
    )
    if status != 0:
        raise MemoryError if status == -2 else ValueError(f"float linear: [{n}, {k}]")
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
