"""The gated MLP's activation: silu(gate) * up of a fused gate/up projection's output, in one
launch (torch runs it as two). Elementwise, hence batch-invariant."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lanes.kernels.common import FLOAT_DTYPES, check, pdl_launch, wait_for_inputs
from lanes.kernels.triton_shim import tl, triton

BLOCK = 1024


@triton.jit
def _silu_mul_kernel(x_ptr, out_ptr, total, width, BLOCK: tl.constexpr, PDL: tl.constexpr):
    wait_for_inputs(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # flat index into out [M, width]
    mask = offs < total
    src = (offs // width) * 2 * width + offs % width
    gate = tl.load(x_ptr + src, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + src + width, mask=mask, other=0.0).to(tl.float32)
    # as torch's F.silu(gate) * up in the dtype: the silu rounded, then the product rounded
    silu = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + offs, (silu * up).to(out_ptr.dtype.element_ty), mask=mask)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [M, 2I] (gate | up) -> silu(gate) * up [M, I]."""
    check(
        gate_up.dim() == 2 and gate_up.is_contiguous() and gate_up.shape[1] % 2 == 0,
        f"gate_up must be contiguous [M, 2I], got {tuple(gate_up.shape)}",
    )
    check(gate_up.dtype in FLOAT_DTYPES, f"dtype {gate_up.dtype}")
    m, width = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty((m, width), dtype=gate_up.dtype, device=gate_up.device)
    if out.numel():
        _silu_mul_kernel[(triton.cdiv(out.numel(), BLOCK),)](
            gate_up, out, out.numel(), width, BLOCK=BLOCK, **pdl_launch(out.device)
        )
    return out


def ref_silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
