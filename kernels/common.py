"""Shared helpers for kernel launchers."""

from __future__ import annotations

import functools
import os

import torch

from lanes.kernels.triton_shim import tl, triton

try:  # grid dependency control (Triton >= 3.4)
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - older Triton: no programmatic dependent launch
    gdc_launch_dependents = gdc_wait = None


def interpreting() -> bool:
    """True when Triton runs kernels on the CPU interpreter (TRITON_INTERPRET=1): there, kernels
    convert bf16/fp16 loads to fp32 at once (bf16 arithmetic came out wrong in the interpreter)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def check(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(message)


FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def conv_window_after(conv: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """A causal conv's window [channels, kernel - 1] (float32) after one lane's rows
    [T, channels]: the recurrent kernels (delta rule, Mamba-2) leave this data movement to torch."""
    return torch.cat([conv, rows.float().T], dim=1)[:, rows.shape[0] :]


def advance_conv_windows(
    conv_pool: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor, rows_per_lane: int
) -> None:
    """conv_window_after for lanes of rows_per_lane rows each, their windows in pool slots (a
    device tensor), written back in place."""
    t = rows_per_lane
    lanes = rows.view(slots.shape[0], t, -1).float().transpose(1, 2)  # [lanes, channels, T]
    conv_pool.index_copy_(0, slots, torch.cat([conv_pool[slots], lanes], dim=2)[:, :, t:])


@functools.cache
def _pdl_device(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def pdl_launch(device: torch.device) -> dict:
    """Launch arguments for programmatic dependent launch: on Hopper and later, a kernel's
    programs may start while the previous kernel's last programs run, and wait (`wait_for_inputs`)
    only where they first touch memory. Inside a decode graph's chain of ~300 small launches that
    hides each launch's start. Off on the CPU interpreter, before Hopper, without Triton's grid
    dependency control, and with LANES_PDL=0 (for before/after measurements in one run)."""
    on = (
        device.type == "cuda"
        and not interpreting()
        and gdc_wait is not None
        and os.environ.get("LANES_PDL", "1") != "0"
        and _pdl_device(device.index if device.index is not None else torch.cuda.current_device())
    )
    return {"PDL": True, "launch_pdl": True} if on else {"PDL": False}


def unfused_launch() -> dict:
    """Launch arguments that keep every multiply and add rounded on its own (PTX `mul.rn` /
    `add.rn`), with fmas only where the source writes `tl.fma`. Without them ptxas may fuse a
    plain multiply and add into an fma, and decides per compiled variant: on the H200 the
    delta-rule kernel kept other bits for the same row with and without its per-row states
    stored (a constexpr), and with the row count 1 (which Triton specializes). For kernels whose
    rows must agree across variants and launches; the interpreter has no such option."""
    return {} if interpreting() else {"enable_fp_fusion": False}


_tickets: dict[tuple[torch.device, str], torch.Tensor] = {}


def tickets(device: torch.device, count: int, kernel: str) -> torch.Tensor:
    """Arrival counters for a reduction finished inside the kernel by the last of its programs
    to arrive (matmul's split-K, attention's key partitions), zero between launches: the last
    arrival resets its counter. One buffer per device and kernel family: kernels on one stream
    run one after another (under programmatic dependent launch too, since a program counts only
    after `wait_for_inputs`), so they never share a counter at the same time. At least 16K
    counters (matmul splits only where a weight has fewer column tiles than the target, so at
    most 4 row tiles x that many; attention splits below 256 programs), created outside graph
    captures (a capture cannot allocate them)."""
    buf = _tickets.get((device, kernel))
    if buf is None or buf.numel() < count:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"{kernel}: the arrival tickets must exist before a graph capture")
        buf = torch.zeros(max(count, 1 << 14), dtype=torch.int32, device=device)
        _tickets[(device, kernel)] = buf
    return buf


@triton.jit
def wait_for_inputs(PDL: tl.constexpr):
    """Under programmatic dependent launch: wait until the previous kernel has completed and its
    writes are visible (before this program reads or writes any buffer it may touch), then let
    the next kernel's programs start. Call first, before any load or store."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def fp32_dot(a, b_t, acc, ROW_STABLE: tl.constexpr):
    """acc + a @ b_t in true fp32 (no TF32). ROW_STABLE (the CPU interpreter): as a broadcast
    product summed over K instead of numpy's matmul, which rounds a row by its place in the
    tile (numpy 2.4's OpenBLAS 0.3.31: a row alone and the same row 11th in its tile differed
    in the last bit); the sum adds each row's products in one order wherever the row sits."""
    if ROW_STABLE:
        return acc + tl.sum(a[:, :, None] * b_t[None, :, :], axis=1)
    else:
        return tl.dot(a, b_t, acc, input_precision="ieee")
