"""RMSNorm with a fused residual add: one program per row, fp32 math, one fixed reduction."""

from __future__ import annotations

import torch

from lanes.kernels.common import FLOAT_DTYPES, check, pdl_launch, wait_for_inputs
from lanes.kernels.triton_shim import tl, triton


@triton.jit
def _add_rms_norm_kernel(
    x_ptr,  # [M, D]
    res_ptr,  # [M, D] or dummy
    w_ptr,  # [D]
    out_ptr,  # [M, D]
    sum_ptr,  # [M, D]: x + res (the new residual stream), or dummy
    D,
    eps,
    HAS_RES: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_for_inputs(PDL)
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < D
    # fp32 right after every load: bf16 arithmetic is wrong in the CPU interpreter, and an fp32
    # add rounded once to the dtype is exactly what torch's bf16 `h + delta` computes
    x = tl.load(x_ptr + row * D + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        r = tl.load(res_ptr + row * D + cols, mask=mask, other=0.0).to(tl.float32)
        x = (x + r).to(x_ptr.dtype.element_ty).to(tl.float32)
        tl.store(sum_ptr + row * D + cols, x.to(x_ptr.dtype.element_ty), mask=mask)
    xf = x
    var = tl.sum(xf * xf, axis=0) / D
    y = (xf * tl.math.rsqrt(var + eps)).to(x_ptr.dtype.element_ty)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(
        out_ptr + row * D + cols, (w * y.to(tl.float32)).to(out_ptr.dtype.element_ty), mask=mask
    )


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + residual, rmsnorm(x + residual) * weight); without residual, (x, rmsnorm(x) * w)."""
    check(x.dim() == 2 and x.is_contiguous(), f"x must be contiguous [M, D], got {tuple(x.shape)}")
    check(
        x.dtype in FLOAT_DTYPES and weight.dtype == x.dtype, f"dtypes x {x.dtype}, w {weight.dtype}"
    )
    check(weight.shape == (x.shape[1],), "weight must be [D]")
    if residual is not None:
        check(
            residual.shape == x.shape and residual.is_contiguous() and residual.dtype == x.dtype,
            "residual must match x",
        )
    m, d = x.shape
    out = torch.empty_like(x)
    summed = torch.empty_like(x) if residual is not None else x
    if m:
        _add_rms_norm_kernel[(m,)](
            x,
            residual if residual is not None else x,
            weight,
            out,
            summed,
            d,
            eps,
            HAS_RES=residual is not None,
            BLOCK=triton.next_power_of_2(d),
            **pdl_launch(x.device),
        )
    return summed, out


def ref_add_rms_norm(x, residual, weight, eps):
    s = (x + residual).to(x.dtype) if residual is not None else x
    sf = s.float()
    y = (sf * torch.rsqrt(sf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return s, (weight.float() * y.float()).to(x.dtype)
