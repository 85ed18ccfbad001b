"""A DeltaNet layer's conv and gated delta rule, in plain torch (`delta_rule_steps`: the CPU
ops' recurrence and the kernel's reference) and as Triton kernels: one program per (lane, value
head, block of value columns) holding its part of the state S [dk, dv] in registers across the
lane's rows, then one program per row and head for the gated RMSNorm (which needs the whole head).
`gated_delta` runs one lane whose state is passed in; `gated_delta_lanes` runs lanes of equal row
counts whose states sit in pool slots named by a device tensor (CUDA graphs).

One lane's rows, with its conv window (the last `kernel - 1` inputs) and recurrent state S
[value heads, dk, dv], both float32:

    q, k, v = silu(depthwise causal conv(mixed))        q, k L2-normalised; q / sqrt(dk)
    beta = sigmoid(b),  decay = exp(neg_a * softplus(a + dt_bias))
    S = decay * S;  S = S + k (beta (v - S^T k))^T;  o = S^T q
    out = gated_rmsnorm(o, z) = norm(o) * weight * silu(z)

Each row is the same computation on tensors whose shapes come from the model alone, rows taken
in ascending order, so a position's bits do not depend on how the lane's rows are split into
forwards (prefill chunks, decode, verify) or on other lanes. In the kernels: the conv's taps
summed in order, the L2 norms and S^T k, S^T q as reductions over dk, the gated RMSNorm over
dv, the same layouts in every launch. The new conv window (the last kernel - 1 inputs) is data
movement, left to torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from lanes.kernels.common import (
    advance_conv_windows,
    check,
    conv_window_after,
    interpreting,
    unfused_launch,
)
from lanes.kernels.triton_shim import tl, triton

L2_EPS = 1e-6  # transformers' l2norm (and flash-linear-attention's)


@dataclass(frozen=True)
class DeltaRuleWeights:
    """A DeltaNet layer's parameters the recurrence reads, and its head layout."""

    taps: torch.Tensor  # [conv_dim, kernel] float32: the depthwise causal conv
    neg_a: torch.Tensor  # [v_heads] float32: -exp(A_log)
    dt_bias: torch.Tensor  # [v_heads] float32
    norm: torch.Tensor  # [dv] model dtype: the gated RMSNorm's weight
    key_heads: int
    value_heads: int
    key_dim: int
    value_dim: int
    eps: float  # the gated RMSNorm's


def delta_rule_steps(
    mixed: torch.Tensor,  # [T, conv_dim] the conv's inputs (q | k | v channels)
    z: torch.Tensor | None,  # [T, value_heads * dv] the output gate; None: no outputs wanted
    b: torch.Tensor,  # [T, value_heads]
    a: torch.Tensor,  # [T, value_heads]
    conv: torch.Tensor,  # [conv_dim, kernel - 1] float32
    state: torch.Tensor,  # [value_heads, dk, dv] float32
    w: DeltaRuleWeights,
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """(out [T, value_heads, dv] in the model dtype, or None without z; the conv window and
    state after the last row)."""
    hk, hv, dk, dv = w.key_heads, w.value_heads, w.key_dim, w.value_dim
    out = None
    if z is not None:
        out = torch.empty((mixed.shape[0], hv, dv), dtype=w.norm.dtype, device=mixed.device)
    for r in range(mixed.shape[0]):
        window = torch.cat([conv, mixed[r].float()[:, None]], dim=1)  # [conv_dim, kernel]
        conv = window[:, 1:]
        qkv = F.silu((window * w.taps).sum(dim=1))
        q, k, v = qkv.split([hk * dk, hk * dk, hv * dv])
        q, k = _l2_normalised(q.view(hk, dk)), _l2_normalised(k.view(hk, dk))
        if hv != hk:  # each key head serves hv / hk consecutive value heads
            q, k = q.repeat_interleave(hv // hk, 0), k.repeat_interleave(hv // hk, 0)
        q = q / dk**0.5
        beta = torch.sigmoid(b[r].float())  # [hv]
        decay = torch.exp(w.neg_a * F.softplus(a[r].float() + w.dt_bias))
        state = state * decay[:, None, None]
        remembered = (state * k[:, :, None]).sum(dim=1)  # [hv, dv]: S^T k
        delta = (v.view(hv, dv) - remembered) * beta[:, None]
        state = state + k[:, :, None] * delta[:, None, :]
        if out is not None:
            o = (state * q[:, :, None]).sum(dim=1)  # [hv, dv]: S^T q
            out[r] = _gated_rms_norm(o, z[r].view(hv, dv), w.norm, w.eps)
    return out, conv, state


def _l2_normalised(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + L2_EPS)


def _gated_rms_norm(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """RMSNorm of each head's output [heads, dv] (float32), times weight, times silu(gate); in
    the model dtype, the way transformers rounds it."""
    normed = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (weight * normed.to(weight.dtype) * F.silu(gate.float())).to(weight.dtype)


# a program holds S's dk x BLOCK_V columns in registers (Qwen3.5's 128 x 128 heads: 4 programs per
# head of 4K values each; a whole head per program spilled, compiled for sm_90)
_BLOCK_V = 32
_WARPS = 4


@triton.jit
def _conv_channel(mixed_ptr, conv_ptr, taps_ptr, ch, t, stride_m, KERNEL: tl.constexpr):
    """silu of the causal conv at row t for channels `ch`: taps summed in order, the inputs
    before the lane's first row from its conv window."""
    acc = tl.zeros(ch.shape, dtype=tl.float32)
    for i in tl.static_range(KERNEL):
        p = t - (KERNEL - 1) + i  # the input's row; < 0: in the window
        if p < 0:
            x = tl.load(conv_ptr + ch * (KERNEL - 1) + (p + KERNEL - 1))
        else:
            x = tl.load(mixed_ptr + p * stride_m + ch).to(tl.float32)
        acc = acc + x * tl.load(taps_ptr + ch * KERNEL + i)
    return acc * tl.sigmoid(acc)


@triton.jit
def _gated_delta_kernel(
    mixed_ptr,  # [lanes * T, conv_dim] model dtype, rows stride_m apart; lane l's rows l*T..
    b_ptr,  # [lanes * T, HV] rows stride_b apart
    a_ptr,  # [lanes * T, HV] rows stride_a apart
    slots_ptr,  # [lanes] int64: each lane's slot in the state pools
    conv_ptr,  # [slots, conv_dim, KERNEL - 1] float32, slots conv_stride apart: inputs before row 0
    state_ptr,  # [slots, HV, DK, DV] float32, slots state_stride apart: S before row 0
    taps_ptr,  # [conv_dim, KERNEL] float32
    neg_a_ptr,  # [HV] float32
    dt_bias_ptr,  # [HV] float32
    o_ptr,  # [lanes * T, HV, DV] float32: S^T q of every row, before the gated RMSNorm
    state_out_ptr,  # [slots, HV, DK, DV] float32, slots state_stride apart: S after the last row
    T,  # rows per lane
    stride_m,
    stride_b,
    stride_a,
    conv_stride,
    state_stride,
    q_scale,  # 1 / sqrt(DK)
    l2_eps,
    HK: tl.constexpr,
    HV: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_V: tl.constexpr,  # value columns of S per program
    KERNEL: tl.constexpr,
    STORE_STATE: tl.constexpr,  # False: S is read, never written (verify rows, settled later)
):
    lane = tl.program_id(0)
    h = tl.program_id(1)  # value head
    kh = h // (HV // HK)  # the key head it reads
    slot = tl.load(slots_ptr + lane)  # int64: pools of many slots pass 2**31 elements
    dk = tl.arange(0, DK)
    dv = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    q_ch = kh * DK + dk
    k_ch = HK * DK + kh * DK + dk
    v_ch = 2 * HK * DK + h * DV + dv
    s_offs = slot * state_stride + h * DK * DV + dk[:, None] * DV + dv[None, :]
    S = tl.load(state_ptr + s_offs)
    neg_a = tl.load(neg_a_ptr + h)
    dt_bias = tl.load(dt_bias_ptr + h)
    mixed_ptr += lane * T * stride_m
    conv_ptr += slot * conv_stride
    for t in range(0, T):
        q = _conv_channel(mixed_ptr, conv_ptr, taps_ptr, q_ch, t, stride_m, KERNEL)
        k = _conv_channel(mixed_ptr, conv_ptr, taps_ptr, k_ch, t, stride_m, KERNEL)
        v = _conv_channel(mixed_ptr, conv_ptr, taps_ptr, v_ch, t, stride_m, KERNEL)
        q = q * tl.rsqrt(tl.sum(q * q, axis=0) + l2_eps) * q_scale
        k = k * tl.rsqrt(tl.sum(k * k, axis=0) + l2_eps)
        row = lane * T + t
        beta = tl.sigmoid(tl.load(b_ptr + row * stride_b + h).to(tl.float32))
        x = tl.load(a_ptr + row * stride_a + h).to(tl.float32) + dt_bias
        softplus = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(x)))  # torch's threshold
        S = S * tl.exp(neg_a * softplus)
        remembered = tl.sum(S * k[:, None], axis=0)  # [BLOCK_V]: S^T k
        delta = (v - remembered) * beta
        S = S + k[:, None] * delta[None, :]
        tl.store(o_ptr + (row * HV + h) * DV + dv, tl.sum(S * q[:, None], axis=0))  # S^T q
    if STORE_STATE:
        tl.store(state_out_ptr + s_offs, S)


@triton.jit
def _gated_norm_kernel(
    o_ptr,  # [T * HV, DV] float32
    z_ptr,  # [T, HV * DV] rows stride_z apart
    norm_ptr,  # [DV] model dtype
    out_ptr,  # [T * HV, DV] model dtype
    stride_z,
    eps,
    HV: tl.constexpr,
    DV: tl.constexpr,
):
    """One (row, value head): RMSNorm of its output, times weight, times silu(z), rounded as
    _gated_rms_norm rounds it."""
    row = tl.program_id(0)
    dv = tl.arange(0, DV)
    o = tl.load(o_ptr + row * DV + dv)
    normed = (o * tl.rsqrt(tl.sum(o * o, axis=0) / DV + eps)).to(out_ptr.dtype.element_ty)
    weight = tl.load(norm_ptr + dv).to(tl.float32)
    scaled = (weight * normed.to(tl.float32)).to(out_ptr.dtype.element_ty).to(tl.float32)
    gate = tl.load(z_ptr + (row // HV) * stride_z + (row % HV) * DV + dv).to(tl.float32)
    tl.store(
        out_ptr + row * DV + dv, (scaled * (gate * tl.sigmoid(gate))).to(out_ptr.dtype.element_ty)
    )


def gated_delta(
    mixed: torch.Tensor,
    z: torch.Tensor | None,
    b: torch.Tensor,
    a: torch.Tensor,
    conv: torch.Tensor,
    state: torch.Tensor,
    w: DeltaRuleWeights,
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """As delta_rule_steps (same arguments and results): one lane, its state passed in and the
    state after its rows returned."""
    check(conv.dtype == torch.float32 and state.dtype == torch.float32, "float32 state")
    conv_pool, state_pool = conv.contiguous()[None], state.contiguous()[None]
    state_out = torch.empty_like(state_pool)
    slots = torch.zeros(1, dtype=torch.int64, device=mixed.device)
    out = _launch(mixed, z, b, a, conv_pool, state_pool, state_out, slots, mixed.shape[0], w)
    state_after = state_out[0] if mixed.shape[0] else state
    return out, conv_window_after(conv, mixed), state_after


def gated_delta_lanes(
    mixed: torch.Tensor,  # [lanes * T, conv_dim]: lane l's rows are l*T .. l*T + T - 1
    z: torch.Tensor,  # [lanes * T, value_heads * dv]
    b: torch.Tensor,  # [lanes * T, value_heads]
    a: torch.Tensor,  # [lanes * T, value_heads]
    conv_pool: torch.Tensor,  # [slots, conv_dim, kernel - 1] float32 (a view of one layer)
    state_pool: torch.Tensor,  # [slots, value_heads, dk, dv] float32
    slots: torch.Tensor,  # [lanes] int64: each lane's slot
    rows_per_lane: int,
    w: DeltaRuleWeights,
    advance: bool,
) -> torch.Tensor:
    """Several lanes of T rows each in one launch, states read from their pool slots (a CUDA
    graph's form: nothing on the host depends on which slots). With `advance` each lane's conv
    window and state after its last row are written back to its slot; without, the pools stay
    as they were (verify rows, whose state is settled once acceptance is known). Lanes sharing
    a slot (graph padding) must be padding: their writes race. Each row gets the bits
    gated_delta gives it: the same program, rows in the same order."""
    lanes, t = slots.shape[0], rows_per_lane
    check(mixed.shape[0] == lanes * t, "rows must be lanes x rows_per_lane")
    check(slots.dtype == torch.int64, "slots must be int64")
    out = _launch(mixed, z, b, a, conv_pool, state_pool, state_pool, slots, t, w, advance)
    if advance:  # after the kernel, which reads the old windows
        advance_conv_windows(conv_pool, slots, mixed, t)
    return out


def _launch(mixed, z, b, a, conv_pool, state_pool, state_out, slots, t, w, store=True):
    """The delta-rule kernel over lanes of t rows, then the gated RMSNorm over every row (none
    without z): out [lanes * t, value_heads, dv] in the model dtype, or None."""
    hk, hv, dk, dv = w.key_heads, w.value_heads, w.key_dim, w.value_dim
    n, conv_dim = mixed.shape
    kernel = w.taps.shape[1]
    check(conv_dim == 2 * hk * dk + hv * dv and hv % hk == 0, "DeltaNet head layout")
    check(
        dk == triton.next_power_of_2(dk) and dv == triton.next_power_of_2(dv),
        f"head dims must be powers of two, got {dk}, {dv}",
    )
    check(conv_pool.shape[1:] == (conv_dim, kernel - 1), "conv window")
    check(state_pool.shape[1:] == (hv, dk, dv), "recurrent state")
    for x in (conv_pool, state_pool):
        check(x.dtype == torch.float32 and x[0].is_contiguous(), "float32 slots, each contiguous")
    check(state_out.stride(0) == state_pool.stride(0), "state_out laid out as the state pool")
    for x, name in ((mixed, "mixed"), (z, "z"), (b, "b"), (a, "a")):
        check(x is None or x.stride(-1) == 1, f"{name} needs unit stride along its last dim")
    out = None if z is None else torch.empty((n, hv, dv), dtype=w.norm.dtype, device=mixed.device)
    if not n:
        return out
    o = torch.empty((n, hv, dv), dtype=torch.float32, device=mixed.device)
    block_v = min(dv, _BLOCK_V)
    _gated_delta_kernel[(slots.shape[0], hv, dv // block_v)](
        mixed, b, a, slots, conv_pool, state_pool, w.taps.contiguous(), w.neg_a, w.dt_bias, o,
        state_out, t, mixed.stride(0), b.stride(0), a.stride(0), conv_pool.stride(0),
        state_pool.stride(0), dk**-0.5, L2_EPS,
        HK=hk, HV=hv, DK=dk, DV=dv, BLOCK_V=block_v, KERNEL=kernel, STORE_STATE=store,
        **({} if interpreting() else {"num_warps": _WARPS}), **unfused_launch(),
    )  # fmt: skip
    if z is not None:
        _gated_norm_kernel[(n * hv,)](
            o, z, w.norm, out, z.stride(0), w.eps, HV=hv, DV=dv, **unfused_launch()
        )
    return out


def ref_gated_delta(mixed, z, b, a, conv, state, w):
    """The torch form (delta_rule_steps)."""
    return delta_rule_steps(mixed, z, b, a, conv, state, w)


def ref_gated_delta_lanes(mixed, z, b, a, conv_pool, state_pool, slots, rows_per_lane, w, advance):
    """gated_delta_lanes lane by lane in the torch form."""
    t, outs = rows_per_lane, []
    for lane, slot in enumerate(slots.tolist()):
        rows = slice(lane * t, (lane + 1) * t)
        out, conv, state = delta_rule_steps(
            mixed[rows], z[rows], b[rows], a[rows], conv_pool[slot], state_pool[slot], w
        )
        outs.append(out)
        if advance:
            conv_pool[slot], state_pool[slot] = conv, state
    return torch.cat(outs)
