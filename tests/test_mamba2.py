"""Nemotron-H's Mamba-2 mixer (lanes/models/mamba2.py) through the torch form and the Triton
kernels (kernels/mamba2.py; interpreted on the CPU), against transformers'
`NemotronHMamba2Mixer` (its torch path) on a tiny random layer: the same output within float32
rounding of its chunked algorithm; a prompt split anywhere, or fed a token at a time with the
states carried, gives the whole prompt's bits; the kernel's lanes form (states in pool slots,
the CUDA-graph path) gives each lane the one-lane launch's bits; negative control: the conv
window not carried over a split changes them."""

from __future__ import annotations

import pytest
import torch

from lanes.backends import make_ops
from lanes.kernels.mamba2 import ssd_scan, ssd_scan_lanes
from lanes.models.mamba2 import (
    Mamba2Shape,
    Mamba2Weights,
    mamba2_mixer,
    mamba2_rule,
    mamba2_state_shapes,
)

T = 19
# the Triton kernels run natively where there is a GPU, interpreted on the CPU elsewhere
TRITON_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def layer():
    from transformers import NemotronHConfig
    from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHMamba2Mixer

    cfg = NemotronHConfig(
        hidden_size=64, mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=8, n_groups=2,
        conv_kernel=4, chunk_size=8, layers_block_type=["mamba"], num_hidden_layers=1,
        use_conv_bias=True, layer_norm_epsilon=1e-5,
    )  # fmt: skip
    torch.manual_seed(0)
    mixer = NemotronHMamba2Mixer(cfg, layer_idx=0).eval()
    with torch.no_grad():
        for p in mixer.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    shape = Mamba2Shape(heads=4, head_dim=16, state=8, groups=2, kernel=4, eps=1e-5)
    w = Mamba2Weights(
        in_proj=mixer.in_proj.weight.detach().clone(),
        conv=mixer.conv1d.weight.detach()[:, 0].clone(),
        conv_bias=mixer.conv1d.bias.detach().clone(),
        dt_bias=mixer.dt_bias.detach().float().clone(),
        neg_a=-torch.exp(mixer.A_log.detach().float()),
        d=mixer.D.detach().float().clone(),
        norm=mixer.norm.weight.detach().clone(),
        out=mixer.out_proj.weight.detach().clone(),
    )
    return mixer, shape, w


def _zeros(shape, device="cpu"):
    conv, ssm = mamba2_state_shapes(shape)
    return torch.zeros(conv, device=device), torch.zeros(ssm, device=device)


def _on(kernels: str, w: Mamba2Weights):
    """(ops, device, the weights there) for the torch form or the Triton kernels."""
    device = TRITON_DEVICE if kernels == "triton" else "cpu"
    moved = {k: v.to(device) for k, v in vars(w).items()}
    return make_ops(True, device, kernels), device, Mamba2Weights(**moved)


@pytest.mark.parametrize("kernels", ["torch", "triton"])
def test_mixer_matches_transformers(layer, kernels):
    mixer, shape, w = layer
    ops, device, w = _on(kernels, w)
    x = torch.randn(T, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = mixer(x[None])[0]
    got, _, _ = mamba2_mixer(ops, x.to(device), w, shape, *_zeros(shape, device))
    tol = 1e-5 if device == "cpu" else 1e-4  # a GPU's float32 matmul sums in another order
    torch.testing.assert_close(got.cpu(), want, rtol=tol, atol=tol)


@pytest.mark.parametrize(
    ("kernels", "split"), [("torch", 1), ("torch", 7), ("torch", 12), ("triton", 12)]
)
def test_split_prompts_and_decoding_give_the_whole_prompts_bits(layer, kernels, split):
    _, shape, w = layer
    ops, device, w = _on(kernels, w)
    x = torch.randn(T, 64, generator=torch.Generator().manual_seed(2)).to(device)
    whole, conv_end, ssm_end = mamba2_mixer(ops, x, w, shape, *_zeros(shape, device))
    first, conv, ssm = mamba2_mixer(ops, x[:split], w, shape, *_zeros(shape, device))
    parts = [first]
    for t in range(split, T):  # then decode, a token at a time
        y, conv, ssm = mamba2_mixer(ops, x[t : t + 1], w, shape, conv, ssm)
        parts.append(y)
    assert torch.equal(torch.cat(parts), whole)
    assert torch.equal(conv, conv_end) and torch.equal(ssm, ssm_end)


def test_negative_control_a_split_without_the_conv_window_differs(layer):
    _, shape, w = layer
    ops = make_ops(True, "cpu")
    x = torch.randn(T, 64, generator=torch.Generator().manual_seed(3))
    whole, _, _ = mamba2_mixer(ops, x, w, shape, *_zeros(shape))
    first, _, ssm = mamba2_mixer(ops, x[:7], w, shape, *_zeros(shape))
    rest, _, _ = mamba2_mixer(ops, x[7:], w, shape, _zeros(shape)[0], ssm)
    assert not torch.equal(torch.cat([first, rest]), whole)


def test_the_kernels_lanes_form_gives_each_lane_its_own_bits(layer):
    """Three lanes of 5 rows in one launch, their states in pool slots 2, 0 and 1: each lane's
    output, conv window and state are the one-lane launch's, bitwise; without `advance` the
    pools are left as they were (verify rows)."""
    _, shape, w = layer
    _, device, w = _on("triton", w)
    rule = mamba2_rule(w, shape)
    gen = torch.Generator().manual_seed(4)
    lanes, t = 3, 5
    xbc = torch.randn(lanes * t, shape.conv_dim, generator=gen).to(device)
    z = torch.randn(lanes * t, shape.inner, generator=gen).to(device)
    dt = torch.randn(lanes * t, shape.heads, generator=gen).to(device)
    conv_shape, state_shape = mamba2_state_shapes(shape)
    conv_pool = torch.randn(4, *conv_shape, generator=gen).to(device)
    state_pool = (torch.randn(4, *state_shape, generator=gen) * 0.1).to(device)
    slots = torch.tensor([2, 0, 1], device=device)
    want = []
    for lane, slot in enumerate(slots.tolist()):
        rows = slice(lane * t, (lane + 1) * t)
        want.append(ssd_scan(xbc[rows], z[rows], dt[rows], conv_pool[slot], state_pool[slot], rule))
    before = conv_pool.clone(), state_pool.clone()
    kept = ssd_scan_lanes(xbc, z, dt, conv_pool, state_pool, slots, t, rule, advance=False)
    assert torch.equal(conv_pool, before[0]) and torch.equal(state_pool, before[1])
    out = ssd_scan_lanes(xbc, z, dt, conv_pool, state_pool, slots, t, rule, advance=True)
    assert torch.equal(out, kept) and torch.equal(out, torch.cat([o for o, _, _ in want]))
    for (_, conv, state), slot in zip(want, slots.tolist(), strict=True):
        assert torch.equal(conv_pool[slot], conv) and torch.equal(state_pool[slot], state)
    assert torch.equal(conv_pool[3], before[0][3])  # no lane's slot
