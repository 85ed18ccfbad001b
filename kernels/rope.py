"""Rotary embedding, rotate-half layout, on q or k [tokens, heads, head_dim] with per-token
cos/sin rows (gathered from the llama3-scaled or plain tables by absolute position)."""

from __future__ import annotations

import torch

from lanes.kernels.common import FLOAT_DTYPES, check, pdl_launch, wait_for_inputs
from lanes.kernels.triton_shim import tl, triton

# heads per program (at most): a program rotates a [heads, head_dim] tile of one token, so a
# prefill of T tokens runs T x (HQ + HKV) / 8 programs instead of one per token and head (8K
# tokens of the 8B shape: 41K programs, not 328K). Chosen from the head counts only, so a token's
# bits never depend on how many tokens share the launch.
HEADS_PER_PROGRAM = 8


def _heads_per_program(heads: int) -> int:
    return min(HEADS_PER_PROGRAM, triton.next_power_of_2(heads))


@triton.jit
def _rope_kernel(
    x_ptr,  # [T, H, D]
    cos_ptr,  # [T, D/2] fp32
    sin_ptr,  # [T, D/2] fp32
    out_ptr,  # [T, H, D]
    H,
    HALF: tl.constexpr,
    BLOCK: tl.constexpr,
    HEADS: tl.constexpr,
):
    t = tl.program_id(0)
    h = tl.program_id(1) * HEADS + tl.arange(0, HEADS)
    base = t * H * 2 * HALF
    cos_row, sin_row = cos_ptr + t * HALF, sin_ptr + t * HALF
    _rope_heads(
        x_ptr + base, out_ptr + base, h, h < H, cos_row, sin_row, x_ptr, 0.0, 2 * HALF, False,
        HALF, BLOCK,
    )  # fmt: skip


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
        heads = _heads_per_program(h)
        _rope_kernel[(t, triton.cdiv(h, heads))](
            x, cos, sin, out, h, HALF=d // 2, BLOCK=triton.next_power_of_2(d // 2), HEADS=heads
        )
    return out


def ref_rope(x, cos, sin):
    half = x.shape[-1] // 2
    xf = x.float()
    x1, x2 = xf[..., :half], xf[..., half:]
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)


@triton.jit
def _rope_heads(
    src,
    dst,
    heads,
    real,
    cos_ptr,
    sin_ptr,
    norm_ptr,
    eps,
    D,
    NORM: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Heads `heads` (where `real`) of one token, each D contiguous values D apart from src and
    dst: optional RMSNorm per head (fp32, rounded to the dtype, times the weight), then the
    rotation, stored at dst."""
    i = tl.arange(0, BLOCK)
    mask = real[:, None] & (i < HALF)[None, :]
    at = heads[:, None] * D + i[None, :]
    x1 = tl.load(src + at, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF + at, mask=mask, other=0.0).to(tl.float32)
    if NORM:
        inv = tl.math.rsqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / D + eps)
        w1 = tl.load(norm_ptr + i, mask=i < HALF, other=0.0).to(tl.float32)[None, :]
        w2 = tl.load(norm_ptr + HALF + i, mask=i < HALF, other=0.0).to(tl.float32)[None, :]
        x1 = (x1 * inv[:, None]).to(dst.dtype.element_ty).to(tl.float32)
        x2 = (x2 * inv[:, None]).to(dst.dtype.element_ty).to(tl.float32)
        x1 = (w1 * x1).to(dst.dtype.element_ty).to(tl.float32)
        x2 = (w2 * x2).to(dst.dtype.element_ty).to(tl.float32)
    c = tl.load(cos_ptr + i, mask=i < HALF, other=0.0)[None, :]
    s = tl.load(sin_ptr + i, mask=i < HALF, other=0.0)[None, :]
    tl.store(dst + at, (x1 * c - x2 * s).to(dst.dtype.element_ty), mask=mask)
    tl.store(dst + HALF + at, (x2 * c + x1 * s).to(dst.dtype.element_ty), mask=mask)


@triton.jit
def _rope_kv_write_kernel(
    q_ptr,  # [T, HQ, D], rows stride_q apart
    k_ptr,  # [T, HKV, D], rows stride_k apart
    v_ptr,  # [T, HKV, D], rows stride_v apart
    cos_ptr,  # [T, D/2] fp32
    sin_ptr,  # [T, D/2] fp32
    q_norm_ptr,  # [D] or dummy
    k_norm_ptr,  # [D] or dummy
    slots_ptr,  # [T] int64
    q_out_ptr,  # [T, HQ, D]
    k_cache_ptr,  # [S, HKV, D]
    v_cache_ptr,  # [S, HKV, D]
    stride_q,
    stride_k,
    stride_v,
    HQ,
    HKV,
    eps,
    NORM: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK: tl.constexpr,
    HEADS_Q: tl.constexpr,  # query heads per program
    HEADS_KV: tl.constexpr,  # key/value heads per program
    PDL: tl.constexpr,
):
    wait_for_inputs(PDL)
    t = tl.program_id(0)
    p = tl.program_id(1)  # query-head programs first, then key/value-head programs
    D = 2 * HALF
    cos_row = cos_ptr + t * HALF
    sin_row = sin_ptr + t * HALF
    q_programs = tl.cdiv(HQ, HEADS_Q)
    if p < q_programs:
        h = p * HEADS_Q + tl.arange(0, HEADS_Q)
        _rope_heads(
            q_ptr + t * stride_q, q_out_ptr + t * HQ * D, h, h < HQ, cos_row, sin_row,
            q_norm_ptr, eps, D, NORM, HALF, BLOCK,
        )  # fmt: skip
    else:
        hk = (p - q_programs) * HEADS_KV + tl.arange(0, HEADS_KV)
        real = hk < HKV
        slot_row = tl.load(slots_ptr + t) * HKV * D  # the token's slot: its heads are D apart
        _rope_heads(
            k_ptr + t * stride_k, k_cache_ptr + slot_row, hk, real, cos_row, sin_row,
            k_norm_ptr, eps, D, NORM, HALF, BLOCK,
        )  # fmt: skip
        d = tl.arange(0, 2 * BLOCK)
        at = hk[:, None] * D + d[None, :]
        mask = real[:, None] & (d < D)[None, :]
        tl.store(v_cache_ptr + slot_row + at, tl.load(v_ptr + t * stride_v + at, mask=mask), mask)


def _heads_view(x: torch.Tensor, name: str) -> None:
    check(
        x.dim() == 3 and x.stride(2) == 1 and x.stride(1) == x.shape[2],
        f"{name} must be [T, H, D] with heads contiguous in a row, got {tuple(x.shape)} "
        f"strides {x.stride()}",
    )


def rope_kv_write(q, k, v, cos, sin, k_cache, v_cache, slots, norms=None, eps: float = 0.0):
    """The attention inputs in one launch: q and k rotated (each head RMSNorm-ed first when
    norms = (q_norm, k_norm)), k and v stored at their slots of the caches, q returned
    [T, HQ, D]. q, k, v may be column views of one fused projection's output."""
    for x, name in ((q, "q"), (k, "k"), (v, "v")):
        _heads_view(x, name)
    t, hq, d = q.shape
    hkv = k.shape[1]
    check(k.shape == v.shape == (t, hkv, d), "k and v must be [T, HKV, D] like q's T and D")
    check(k_cache.shape[1:] == (hkv, d) and v_cache.shape == k_cache.shape, "caches [S, HKV, D]")
    check(k_cache.is_contiguous() and v_cache.is_contiguous(), "caches must be contiguous")
    check(q.dtype == k.dtype == v.dtype == k_cache.dtype, "q, k, v and caches share one dtype")
    check(d % 2 == 0 and cos.shape == (t, d // 2) and sin.shape == (t, d // 2), "cos/sin [T, D/2]")
    check(cos.dtype == torch.float32 and sin.dtype == torch.float32, "cos, sin must be float32")
    check(slots.dtype == torch.int64 and slots.shape == (t,), "slots must be int64 [T]")
    cos, sin = cos.contiguous(), sin.contiguous()
    out = torch.empty((t, hq, d), dtype=q.dtype, device=q.device)
    if t:
        q_norm, k_norm = norms if norms is not None else (out, out)
        heads_q, heads_kv = _heads_per_program(hq), _heads_per_program(hkv)
        programs = triton.cdiv(hq, heads_q) + triton.cdiv(hkv, heads_kv)
        _rope_kv_write_kernel[(t, programs)](
            q,
            k,
            v,
            cos,
            sin,
            q_norm,
            k_norm,
            slots,
            out,
            k_cache,
            v_cache,
            q.stride(0),
            k.stride(0),
            v.stride(0),
            hq,
            hkv,
            eps,
            NORM=norms is not None,
            HALF=d // 2,
            BLOCK=triton.next_power_of_2(d // 2),
            HEADS_Q=heads_q,
            HEADS_KV=heads_kv,
            **pdl_launch(q.device),
        )
    return out


def ref_rope_kv_write(q, k, v, cos, sin, k_cache, v_cache, slots, norms=None, eps: float = 0.0):
    """The unfused steps: (norms,) rope, index_copy into the caches."""
    if norms is not None:
        q, k = (_ref_head_norm(x, w, eps) for x, w in zip((q, k), norms, strict=True))
    k_cache.index_copy_(0, slots, ref_rope(k, cos, sin))
    v_cache.index_copy_(0, slots, v.contiguous())
    return ref_rope(q, cos, sin)


def _ref_head_norm(x, weight, eps):
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return (weight.float() * y.float()).to(x.dtype)
