"""A Qwen3.5 hybrid whose DeltaNet layers take the chunked form (`delta_rule="chunked"`,
kernels/chunked_delta.py) through the Triton ops (interpreted on the CPU): greedy tokens equal
transformers', and the equalities hold — prefill chunks, batching, drafting (verify rows read
the carry, settle runs the accepted ones), and a next turn resumed at a chunk boundary inside
the previous answer equal to a fresh engine's. Negative control: decode rows that drop the
current chunk's earlier rows (chunks anchored at each forward) break the next-turn equality.

The chunk is 16 rows here (64 in serving): the same code, a tiny model's prompts and answers
cross several chunk boundaries, and the interpreter runs a chunk's 16-step substitution
rather than a 64-step one."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from lanes import EngineConfig, SamplingParams, build_engine
from lanes.config import ConfigError
from lanes.kernels import chunked_delta
from tests.test_hybrid import PROMPTS
from tests.test_hybrid_kernels import triton_ops_keep_the_equalities

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BASE = dict(kernels="triton", device=DEVICE, dtype="float32", delta_rule="chunked")


@pytest.fixture
def chunk16(monkeypatch):
    monkeypatch.setattr(chunked_delta, "CHUNK", 16)


def _next_turn(path, cfg):
    """(the follow-up resumed inside the first answer, the same follow-up on a fresh engine)."""
    engine = build_engine(str(path), cfg)
    first = engine.tokenizer.encode(PROMPTS[1])
    (answer,) = engine.generate([first], SamplingParams(max_tokens=24, ignore_eos=True))
    turn = first + answer.token_ids + engine.tokenizer.encode(PROMPTS[3])
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    (resumed,) = engine.generate([turn], params)
    (fresh,) = build_engine(str(path), cfg).generate([turn], params)
    engine.check_integrity()
    return len(first), resumed, fresh


def test_the_chunked_form_keeps_the_equalities(tiny_models, chunk16):
    engine = triton_ops_keep_the_equalities(*tiny_models["qwen3_5"], delta_rule="chunked")
    assert engine.runner.decoder.ops.chunked_delta and engine.recurrent.stride == 16
    assert engine.runner.graphs is None


def test_a_next_turn_resumes_at_a_chunk_boundary_inside_the_answer(tiny_models, chunk16):
    path, _ = tiny_models["qwen3_5"]
    cfg = EngineConfig(**BASE, prefill_chunk=16, max_tokens_per_round=16)
    prompt_len, resumed, fresh = _next_turn(path, cfg)
    assert resumed.cached_tokens > prompt_len and resumed.cached_tokens % 16 == 0
    assert (resumed.token_ids, resumed.logprobs) == (fresh.token_ids, fresh.logprobs)


def test_negative_control_decode_rows_without_the_chunk_s_earlier_rows(
    tiny_models, chunk16, monkeypatch
):
    """Each forward reads its slot as if its first row began a chunk: the decoded answer's
    state at the resumed boundary is not a fresh prefill's, and the next turn differs."""
    path, _ = tiny_models["qwen3_5"]
    real = chunked_delta.carry_from_slot

    def anchored_at_the_forward(conv, slot, position, dk, dv):
        carry = real(conv, slot, position, dk, dv)
        return dataclasses.replace(carry, position=position - carry.num_partial)

    monkeypatch.setattr(chunked_delta, "carry_from_slot", anchored_at_the_forward)
    cfg = EngineConfig(**BASE, prefill_chunk=16, max_tokens_per_round=16)
    prompt_len, resumed, fresh = _next_turn(path, cfg)
    assert resumed.cached_tokens > prompt_len
    assert (resumed.token_ids, resumed.logprobs) != (fresh.token_ids, fresh.logprobs)


def test_the_chunked_form_needs_the_triton_ops(tiny_models):
    path, _ = tiny_models["qwen3_5"]
    with pytest.raises(ConfigError, match="Triton"):
        build_engine(str(path), EngineConfig(kernels="torch", delta_rule="chunked"))
    with pytest.raises(ConfigError, match="recurrent or chunked"):
        EngineConfig(delta_rule="blocked")
