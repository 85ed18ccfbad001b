"""A Mamba-2 mixer's conv and selective state-space scan (Nemotron-H's linear-attention layers),
in plain torch (`mamba2_steps`: the CPU ops' recurrence and the kernels' reference) and as
Triton kernels: one program per (lane, head, block of head_dim rows) holding its rows of the
state S [head_dim, state] in registers across the lane's rows, then one program per (row, group)
for the gated group norm (which needs the whole group). `ssd_scan` runs one lane whose state is
passed in; `ssd_scan_lanes` runs lanes of equal row counts whose states sit in pool slots named
by a device tensor (CUDA graphs).

One lane's rows, with its conv window (the last `kernel - 1` inputs) and state S [heads,
head_dim, state], both float32; head h reads group g = h // (heads / groups):

    x, B, C = split(silu(depthwise causal conv(xBC) + conv_bias))
    dt = clamp(softplus(dt + dt_bias), dt_min, dt_max)
    S_h = exp(dt_h * A_h) * S_h + (dt_h * x_h) ⊗ B_g
    y_h = S_h @ C_g + D_h * x_h
    out = group_rms_norm(y * silu(z)) * norm          groups of inner / groups channels

Each row is the same computation on tensors whose shapes come from the model alone, rows taken
in ascending order, so a position's bits do not depend on how the lane's rows are split into
forwards (prefill chunks, decode, verify) or on other lanes. In the kernels: the conv's taps
summed oldest first, S @ C a reduction over the state, the norm a reduction over its group, the
same layouts in every launch. The new conv window is data movement, left to torch.
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


@dataclass(frozen=True)
class Mamba2Rule:
    """A Mamba-2 layer's parameters the scan reads, and its head layout (repeated from
    lanes' Mamba2Shape: kernels take plain data and import nothing of the model's)."""

    taps: torch.Tensor  # [conv_dim, kernel] float32, oldest input first
    conv_bias: torch.Tensor  # [conv_dim] float32 (zeros where the model has none)
    dt_bias: torch.Tensor  # [heads] float32
    neg_a: torch.Tensor  # [heads] float32: -exp(A_log)
    d: torch.Tensor  # [heads] float32: the skip
    norm: torch.Tensor  # [heads * head_dim] model dtype: the gated group norm's weight
    heads: int
    head_dim: int
    state: int
    groups: int
    eps: float
    dt_min: float
    dt_max: float

    @property
    def inner(self) -> int:
        return self.heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        return self.inner + 2 * self.groups * self.state


def mamba2_steps(
    xbc: torch.Tensor,  # [T, conv_dim] the conv's inputs (x | B | C channels)
    z: torch.Tensor | None,  # [T, inner] the output gate; None: no outputs wanted
    dt: torch.Tensor,  # [T, heads]
    conv: torch.Tensor,  # [conv_dim, kernel - 1] float32
    state: torch.Tensor,  # [heads, head_dim, state] float32
    w: Mamba2Rule,
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """(out [T, inner] in the model dtype, or None without z; the conv window and state after
    the last row). The states passed in are not changed."""
    hp, n, g = w.head_dim, w.state, w.groups
    per_group = w.heads // g
    seq = torch.cat([conv, xbc.float().T], dim=1)  # [conv_dim, kernel - 1 + T]
    kernel = w.taps.shape[1]
    out = None
    if z is not None:
        out = torch.empty((xbc.shape[0], w.inner), dtype=w.norm.dtype, device=xbc.device)
    # every step on tensors of the model's shapes alone: elementwise kernels round a vector's
    # tail differently from its body, so a [T, ...] tensor would tie a row's bits to T
    for t in range(xbc.shape[0]):
        mixed = seq[:, t] * w.taps[:, 0]
        for j in range(1, kernel):  # the taps oldest first
            mixed = mixed + seq[:, t + j] * w.taps[:, j]
        mixed = F.silu(mixed + w.conv_bias)
        x, b, c = mixed.split([w.inner, g * n, g * n])
        x = x.view(w.heads, hp)
        b = b.view(g, n).repeat_interleave(per_group, dim=0)  # [heads, state]
        c = c.view(g, n).repeat_interleave(per_group, dim=0)
        step = F.softplus(dt[t].float() + w.dt_bias).clamp(w.dt_min, w.dt_max)  # [heads]
        decay = torch.exp(step * w.neg_a)
        state = state * decay[:, None, None] + (step[:, None] * x)[:, :, None] * b[:, None, :]
        if out is not None:
            y = (state * c[:, None, :]).sum(-1) + w.d[:, None] * x  # [heads, head_dim]
            out[t] = _gated_group_norm(y.reshape(w.inner), z[t].float(), w)
    return out, seq[:, xbc.shape[0] :].contiguous(), state


def _gated_group_norm(y: torch.Tensor, z: torch.Tensor, w: Mamba2Rule) -> torch.Tensor:
    """One row's RMS norm of y * silu(z) [inner] within each group, in the model dtype, times
    the weight (transformers' NemotronHRMSNormGated rounds it so)."""
    grouped = (y * F.silu(z)).view(w.groups, w.inner // w.groups)
    grouped = grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + w.eps)
    return w.norm * grouped.reshape(w.inner).to(w.norm.dtype)


# a program holds BLOCK_P rows of a head's S [head_dim, state] in registers
_BLOCK_P = 16
_WARPS = 4


@triton.jit
def _conv_silu(xbc_ptr, conv_ptr, taps_ptr, bias_ptr, ch, t, stride_x, KERNEL: tl.constexpr):
    """silu of the causal conv (+ bias) at row t for channels `ch`: taps summed oldest first,
    the inputs before the lane's first row from its conv window."""
    acc = tl.zeros(ch.shape, dtype=tl.float32)
    for i in tl.static_range(KERNEL):
        p = t - (KERNEL - 1) + i  # the input's row; < 0: in the window
        if p < 0:
            x = tl.load(conv_ptr + ch * (KERNEL - 1) + (p + KERNEL - 1))
        else:
            x = tl.load(xbc_ptr + p * stride_x + ch).to(tl.float32)
        if i == 0:
            acc = x * tl.load(taps_ptr + ch * KERNEL + i)
        else:
            acc = acc + x * tl.load(taps_ptr + ch * KERNEL + i)
    acc = acc + tl.load(bias_ptr + ch)
    return acc * tl.sigmoid(acc)


@triton.jit
def _ssd_scan_kernel(
    xbc_ptr,  # [lanes * T, conv_dim] model dtype, rows stride_x apart; lane l's rows l*T..
    dt_ptr,  # [lanes * T, H] rows stride_dt apart
    slots_ptr,  # [lanes] int64: each lane's slot in the state pools
    conv_ptr,  # [slots, conv_dim, KERNEL - 1] float32, slots conv_stride apart
    state_ptr,  # [slots, H, P, N] float32, slots state_stride apart: S before row 0
    taps_ptr,  # [conv_dim, KERNEL] float32
    bias_ptr,  # [conv_dim] float32
    dt_bias_ptr,  # [H] float32
    neg_a_ptr,  # [H] float32
    d_ptr,  # [H] float32
    y_ptr,  # [lanes * T, H, P] float32: S @ C + D x of every row, before the gated norm
    state_out_ptr,  # [slots, H, P, N] float32, slots state_stride apart: S after the last row
    T,  # rows per lane
    stride_x,
    stride_dt,
    conv_stride,
    state_stride,
    dt_min,
    dt_max,
    H: tl.constexpr,
    P: tl.constexpr,
    N: tl.constexpr,
    G: tl.constexpr,
    BLOCK_P: tl.constexpr,
    KERNEL: tl.constexpr,
    STORE_STATE: tl.constexpr,  # False: S is read, never written (verify rows, settled later)
):
    lane = tl.program_id(0)
    h = tl.program_id(1)
    g = h // (H // G)
    slot = tl.load(slots_ptr + lane)  # int64: pools of many slots pass 2**31 elements
    p = tl.program_id(2) * BLOCK_P + tl.arange(0, BLOCK_P)
    n = tl.arange(0, N)
    x_ch = h * P + p
    b_ch = H * P + g * N + n
    c_ch = H * P + G * N + g * N + n
    s_offs = slot * state_stride + h * P * N + p[:, None] * N + n[None, :]
    S = tl.load(state_ptr + s_offs)
    dt_bias = tl.load(dt_bias_ptr + h)
    neg_a = tl.load(neg_a_ptr + h)
    skip = tl.load(d_ptr + h)
    xbc_ptr += lane * T * stride_x
    conv_ptr += slot * conv_stride
    for t in range(0, T):
        x = _conv_silu(xbc_ptr, conv_ptr, taps_ptr, bias_ptr, x_ch, t, stride_x, KERNEL)
        b = _conv_silu(xbc_ptr, conv_ptr, taps_ptr, bias_ptr, b_ch, t, stride_x, KERNEL)
        c = _conv_silu(xbc_ptr, conv_ptr, taps_ptr, bias_ptr, c_ch, t, stride_x, KERNEL)
        row = lane * T + t
        v = tl.load(dt_ptr + row * stride_dt + h).to(tl.float32) + dt_bias
        step = tl.where(v > 20.0, v, tl.log(1.0 + tl.exp(v)))  # torch's softplus threshold
        step = tl.minimum(tl.maximum(step, dt_min), dt_max)
        S = S * tl.exp(step * neg_a) + (step * x)[:, None] * b[None, :]
        y = tl.sum(S * c[None, :], axis=1) + skip * x
        tl.store(y_ptr + (row * H + h) * P + p, y)
    if STORE_STATE:
        tl.store(state_out_ptr + s_offs, S)


@triton.jit
def _gated_group_norm_kernel(
    y_ptr,  # [rows, inner] float32
    z_ptr,  # [rows, inner] rows stride_z apart
    norm_ptr,  # [inner] model dtype
    out_ptr,  # [rows, inner] model dtype
    stride_z,
    eps,
    INNER: tl.constexpr,
    GROUP: tl.constexpr,  # channels per group
):
    """One (row, group): RMS norm of y * silu(z), rounded to the model dtype, times the weight."""
    row = tl.program_id(0)
    ch = tl.program_id(1) * GROUP + tl.arange(0, GROUP)
    z = tl.load(z_ptr + row * stride_z + ch).to(tl.float32)
    gated = tl.load(y_ptr + row * INNER + ch) * (z * tl.sigmoid(z))
    normed = gated * tl.rsqrt(tl.sum(gated * gated, axis=0) / GROUP + eps)
    weight = tl.load(norm_ptr + ch)
    tl.store(out_ptr + row * INNER + ch, normed.to(out_ptr.dtype.element_ty) * weight)


def ssd_scan(
    xbc: torch.Tensor,
    z: torch.Tensor | None,
    dt: torch.Tensor,
    conv: torch.Tensor,
    state: torch.Tensor,
    w: Mamba2Rule,
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """As mamba2_steps (same arguments and results): one lane, its state passed in and the state
    after its rows returned."""
    check(conv.dtype == torch.float32 and state.dtype == torch.float32, "float32 state")
    conv_pool, state_pool = conv.contiguous()[None], state.contiguous()[None]
    state_out = torch.empty_like(state_pool)
    slots = torch.zeros(1, dtype=torch.int64, device=xbc.device)
    out = _launch(xbc, z, dt, conv_pool, state_pool, state_out, slots, xbc.shape[0], w)
    state_after = state_out[0] if xbc.shape[0] else state
    return out, conv_window_after(conv, xbc), state_after


def ssd_scan_lanes(
    xbc: torch.Tensor,  # [lanes * T, conv_dim]: lane l's rows are l*T .. l*T + T - 1
    z: torch.Tensor,  # [lanes * T, inner]
    dt: torch.Tensor,  # [lanes * T, heads]
    conv_pool: torch.Tensor,  # [slots, conv_dim, kernel - 1] float32 (a view of one layer)
    state_pool: torch.Tensor,  # [slots, heads, head_dim, state] float32
    slots: torch.Tensor,  # [lanes] int64: each lane's slot
    rows_per_lane: int,
    w: Mamba2Rule,
    advance: bool,
) -> torch.Tensor:
    """Several lanes of T rows each in one launch, states read from their pool slots (a CUDA
    graph's form). With `advance` each lane's conv window and state after its last row are
    written back to its slot; without, the pools stay as they were (verify rows, settled once
    acceptance is known). Lanes sharing a slot (graph padding) must be padding: their writes
    race. Each row gets the bits ssd_scan gives it: the same program, rows in the same order."""
    lanes, t = slots.shape[0], rows_per_lane
    check(xbc.shape[0] == lanes * t, "rows must be lanes x rows_per_lane")
    check(slots.dtype == torch.int64, "slots must be int64")
    out = _launch(xbc, z, dt, conv_pool, state_pool, state_pool, slots, t, w, advance)
    if advance:  # after the kernel, which reads the old windows
        advance_conv_windows(conv_pool, slots, xbc, t)
    return out


def _launch(xbc, z, dt, conv_pool, state_pool, state_out, slots, t, w: Mamba2Rule, store=True):
    """The scan kernel over lanes of t rows, then the gated group norm over every row (none
    without z): out [lanes * t, inner] in the model dtype, or None."""
    hp, n, g = w.head_dim, w.state, w.groups
    rows, conv_dim = xbc.shape
    kernel = w.taps.shape[1]
    group = w.inner // g
    check(conv_dim == w.conv_dim and w.heads % g == 0, "Mamba-2 head layout")
    for size, name in ((hp, "head_dim"), (n, "state"), (group, "channels per group")):
        check(size == triton.next_power_of_2(size), f"{name} must be a power of two, got {size}")
    check(conv_pool.shape[1:] == (conv_dim, kernel - 1), "conv window")
    check(state_pool.shape[1:] == (w.heads, hp, n), "recurrent state")
    for x in (conv_pool, state_pool):
        check(x.dtype == torch.float32 and x[0].is_contiguous(), "float32 slots, each contiguous")
    check(state_out.stride(0) == state_pool.stride(0), "state_out laid out as the state pool")
    for x, name in ((xbc, "xbc"), (z, "z"), (dt, "dt")):
        check(x is None or x.stride(-1) == 1, f"{name} needs unit stride along its last dim")
    out = None if z is None else torch.empty((rows, w.inner), dtype=w.norm.dtype, device=xbc.device)
    if not rows:
        return out
    y = torch.empty((rows, w.heads, hp), dtype=torch.float32, device=xbc.device)
    block_p = min(hp, _BLOCK_P)
    _ssd_scan_kernel[(slots.shape[0], w.heads, hp // block_p)](
        xbc, dt, slots, conv_pool, state_pool, w.taps.contiguous(), w.conv_bias, w.dt_bias,
        w.neg_a, w.d, y, state_out, t, xbc.stride(0), dt.stride(0), conv_pool.stride(0),
        state_pool.stride(0), w.dt_min, min(w.dt_max, 3.0e38),
        H=w.heads, P=hp, N=n, G=g, BLOCK_P=block_p, KERNEL=kernel, STORE_STATE=store,
        **({} if interpreting() else {"num_warps": _WARPS}), **unfused_launch(),
    )  # fmt: skip
    if z is not None:
        _gated_group_norm_kernel[(rows, g)](
            y, z, w.norm, out, z.stride(0), w.eps, INNER=w.inner, GROUP=group,
            **unfused_launch(),
        )  # fmt: skip
    return out


def ref_ssd_scan_lanes(xbc, z, dt, conv_pool, state_pool, slots, rows_per_lane, w, advance):
    """ssd_scan_lanes lane by lane in the torch form."""
    t, outs = rows_per_lane, []
    for lane, slot in enumerate(slots.tolist()):
        rows = slice(lane * t, (lane + 1) * t)
        out, conv, state = mamba2_steps(
            xbc[rows], z[rows], dt[rows], conv_pool[slot], state_pool[slot], w
        )
        outs.append(out)
        if advance:
            conv_pool[slot], state_pool[slot] = conv, state
    return torch.cat(outs)
