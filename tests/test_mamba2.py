"""Nemotron-H's Mamba-2 mixer, the reference form (lanes/models/mamba2.py), against transformers'
`NemotronHMamba2Mixer` (its torch path) on a tiny random layer: the same output within float32
rounding of its chunked algorithm; a prompt split anywhere, or fed a token at a time with the
states carried, gives the whole prompt's bits; negative control: the conv window not carried
over a split changes them."""

from __future__ import annotations

import pytest
import torch

from lanes.backends import make_ops
from lanes.models.mamba2 import Mamba2Shape, Mamba2Weights, mamba2_mixer, mamba2_state_shapes

T = 19


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


def _zeros(shape):
    conv, ssm = mamba2_state_shapes(shape)
    return torch.zeros(conv), torch.zeros(ssm)


def test_mixer_matches_transformers(layer):
    mixer, shape, w = layer
    x = torch.randn(T, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = mixer(x[None])[0]
    got, _, _ = mamba2_mixer(make_ops(True, "cpu"), x, w, shape, *_zeros(shape))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("split", [1, 7, 12])
def test_split_prompts_and_decoding_give_the_whole_prompts_bits(layer, split):
    _, shape, w = layer
    ops = make_ops(True, "cpu")
    x = torch.randn(T, 64, generator=torch.Generator().manual_seed(2))
    whole, conv_end, ssm_end = mamba2_mixer(ops, x, w, shape, *_zeros(shape))
    first, conv, ssm = mamba2_mixer(ops, x[:split], w, shape, *_zeros(shape))
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
