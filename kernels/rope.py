"""Rotary embedding, rotate-half layout, on q or k [tokens, heads, head_dim] with per-token
cos/sin rows (gathered from the llama3-scaled or plain tables by absolute position)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lanes.kernels.common import FLOAT_DTYPES, check


@triton.jit
def _rope_kernel(
    x_ptr,  # [T, H, D]
    cos_ptr,  # [T, D/2] fp32
    sin_ptr,  # [T, D/2] fp32
    out_ptr,  # [T, H, D]
    H,
    HALF: tl.constexpr,
    BLOCK: tl.constexpr,
):
    t = tl.program_id(0)
    h = tl.program_id(1)
    i = tl.arange(0, BLOCK)
    mask = i < HALF
    base = (t * H + h) * 2 * HALF
    x1 = tl.load(x_ptr + base + i, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + base + HALF + i, mask=mask, other=0.0).to(tl.float32)
    c = tl.load(cos_ptr + t * HALF + i, mask=mask, other=0.0)
    s = tl.load(sin_ptr + t * HALF + i, mask=mask, other=0.0)
    tl.store(out_ptr + base + i, (x1 * c - x2 * s).to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(out_ptr + base + HALF + i, (x2 * c + x1 * s).to(out_ptr.dtype.element_ty), mask=mask)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    check(
        x.dim() == 3 and x.is_contiguous() and x.dtype in FLOAT_DTYPES,
        f"x must be contiguous [T, H, D], got {tuple(x.shape)} {x.dtype}",
    )
    t, h, d = x.shape
    check(
        d % 2 == 0 and cos.shape == (t, d // 2) and sin.shape == (t, d // 2),
        "cos, sin must be [T, D/2]",
    )
    check(cos.dtype == torch.float32 and sin.dtype == torch.float32, "cos, sin must be float32")
    cos, sin = cos.contiguous(), sin.contiguous()
    out = torch.empty_like(x)
    if t:
        _rope_kernel[(t, h)](x, cos, sin, out, h, HALF=d // 2, BLOCK=triton.next_power_of_2(d // 2))
    return out


def ref_rope(x, cos, sin):
    half = x.shape[-1] // 2
    xf = x.float()
    x1, x2 = xf[..., :half], xf[..., half:]
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)
