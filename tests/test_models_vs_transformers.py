"""Every architecture against transformers on the same weights: logits close, greedy tokens equal."""

from __future__ import annotations

import pytest
import torch

from lanes import SamplingParams, build_engine
from tests.conftest import ARCHS

PROMPT = "The quick brown fox jumps over"


@pytest.fixture(scope="module")
def engines(tiny_models):
    return {arch: build_engine(str(path)) for arch, (path, _) in tiny_models.items()}


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_logits_close_to_transformers(arch, tiny_models, engines):
    _, hf = tiny_models[arch]
    engine = engines[arch]
    ids = engine.tokenizer.encode(PROMPT * 12)  # > 64 tokens: two key tiles
    (ours,) = engine.prompt_logits([ids])
    with torch.no_grad():
        theirs = hf(torch.tensor([ids])).logits[0].float()
    assert ours.shape == theirs.shape
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_greedy_tokens_equal_transformers_generate(arch, tiny_models, engines):
    _, hf = tiny_models[arch]
    engine = engines[arch]
    ids = engine.tokenizer.encode(PROMPT * 8)  # generation crosses the 64-token key tile
    (out,) = engine.generate([ids], SamplingParams(max_tokens=32, ignore_eos=True))
    hf.generation_config.eos_token_id = None
    with torch.no_grad():
        ref = hf.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False, pad_token_id=0)[
            0, len(ids) :
        ].tolist()
    assert len(out.token_ids) == 32
    assert out.token_ids == ref


def test_llama3_rope_scaling_is_applied(tiny_models):
    """Negative control for the llama3 rope path: reading the same checkpoint without scaling
    gives different logits, so the closeness test above really checks the scaling."""
    import dataclasses

    from lanes.models import open_checkpoint

    path, hf = tiny_models["llama3-rope"]
    ckpt = open_checkpoint(str(path))
    assert ckpt.config.rope_scaling is not None
    plain = dataclasses.replace(ckpt, config=dataclasses.replace(ckpt.config, rope_scaling=None))
    ids = list(range(3, 100))
    (scaled_logits,) = build_engine(checkpoint=ckpt).prompt_logits([ids])
    (plain_logits,) = build_engine(checkpoint=plain).prompt_logits([ids])
    with torch.no_grad():
        theirs = hf(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(scaled_logits, theirs, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(plain_logits, theirs, rtol=1e-4, atol=1e-4)
