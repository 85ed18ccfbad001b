"""Sampling and batch invariance on the CPU: a request's output does not depend on its company."""

from __future__ import annotations

import pytest
import torch

from lanes import EngineConfig, SamplingParams, build_engine

PROMPTS = [
    "The quick brown fox",
    "Paris is the capital of France; Berlin is",
    "def add(a, b):\n    return a + b\n" * 3,
    "Numbers 0123456789",
]


@pytest.fixture(scope="module")
def exact(llama_dir):
    return build_engine(str(llama_dir), EngineConfig(max_tokens_per_round=40))


@pytest.fixture(scope="module")
def fast(llama_dir):
    return build_engine(str(llama_dir), EngineConfig(max_tokens_per_round=40, exact=False))


def _solo_and_batched(engine, params):
    solo = [engine.generate([p], params)[0] for p in PROMPTS]
    batched = engine.generate(PROMPTS, params)
    return solo, batched


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_tokens=24, ignore_eos=True),
        SamplingParams(max_tokens=24, ignore_eos=True, temperature=0.7, top_p=0.9, seed=11),
        SamplingParams(max_tokens=24, ignore_eos=True, temperature=1.0, top_k=20, seed=5),
    ],
    ids=["greedy", "top_p", "top_k"],
)
def test_batched_equals_solo(exact, params):
    # max_tokens_per_round=40 chunks the longer prompts, so lanes prefill while others decode.
    solo, batched = _solo_and_batched(exact, params)
    for s, b in zip(solo, batched, strict=True):
        assert b.token_ids == s.token_ids
        assert b.logprobs == s.logprobs  # bitwise: the same floats, not merely close


@pytest.mark.parametrize("exact_mode", [True, False], ids=["exact", "negative-control-fast"])
def test_bfloat16_on_the_cpu_keeps_batch_invariance(llama_dir, exact_mode):
    """bf16 weights nearly halve CPU decode time (bench/NOTES.md); the exact ops stay
    batch-invariant in bf16 too, and the fast ops do not."""
    cfg = EngineConfig(dtype="bfloat16", exact=exact_mode, max_tokens_per_round=40)
    engine = build_engine(str(llama_dir), cfg)
    assert engine.runner.kv.dtype == torch.bfloat16
    prompts = [  # long enough to be chunked while other lanes decode
        "The quick brown fox jumps over the lazy dog " * 3,
        "Paris is the capital of France; Berlin is",
        "def add(a, b):\n    return a + b\n" * 4,
        "fox",
    ]
    if not exact_mode:
        alone, together = _alone_and_together(engine)
        if torch.equal(alone, together):  # seen on an AMD EPYC box, torch 2.13: no control here
            pytest.skip("the fast ops are batch-invariant in bf16 on this CPU (torch's bf16 GEMM)")
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    solo = [engine.generate([p], params)[0] for p in prompts]
    batched = engine.generate(prompts, params)
    same = [
        (s.token_ids, s.logprobs) == (b.token_ids, b.logprobs)
        for s, b in zip(solo, batched, strict=True)
    ]
    assert all(same) if exact_mode else not all(same)


def _alone_and_together(engine):
    """Logits of a one-token prompt run alone (one row) and between two longer prompts."""
    a, c = (engine.tokenizer.encode(p) for p in PROMPTS[:2])
    b = engine.tokenizer.encode("fox")[:1]
    (alone,) = engine.prompt_logits([b])
    return alone, engine.prompt_logits([a, b, c])[1]


def test_logits_rows_do_not_depend_on_other_rows(exact):
    alone, together = _alone_and_together(exact)
    assert torch.equal(alone, together)


def test_negative_control_fast_logits_rows_depend_on_other_rows(fast):
    alone, together = _alone_and_together(fast)
    torch.testing.assert_close(alone, together, rtol=1e-4, atol=1e-4)  # the same math ...
    assert not torch.equal(alone, together)  # ... but other bits


def test_negative_control_fast_ops_depend_on_batch(fast):
    """Plain torch (one BLAS call per linear, SDPA) changes a lane's logprobs with the batch
    around it: test_batched_equals_solo would fail without the exact ops."""
    solo, batched = _solo_and_batched(fast, SamplingParams(max_tokens=24, ignore_eos=True))
    assert any(s.logprobs != b.logprobs for s, b in zip(solo, batched, strict=True))


def _decode_vs_prefill(engine):
    """(logprobs of the decoded tokens, the same from one prefill over prompt + output)."""
    ids = engine.tokenizer.encode(PROMPTS[1])
    (out,) = engine.generate([ids], SamplingParams(max_tokens=20, ignore_eos=True))
    (logits,) = engine.prompt_logits([ids + out.token_ids])
    rows = torch.log_softmax(logits[len(ids) - 1 : -1], dim=-1)
    assert rows.argmax(dim=-1).tolist() == out.token_ids
    return out.logprobs, rows[torch.arange(len(out.token_ids)), out.token_ids].tolist()


def test_decode_equals_prefill_bitwise(exact):
    """Each decoded token's logprob equals the one a single prefill of the whole text gives."""
    decoded, prefilled = _decode_vs_prefill(exact)
    assert decoded == prefilled


def test_negative_control_fast_decode_differs_from_prefill(fast):
    decoded, prefilled = _decode_vs_prefill(fast)
    assert decoded != prefilled


def test_same_seed_same_tokens_different_seed_different_tokens(exact):
    p = dict(max_tokens=24, ignore_eos=True, temperature=1.0)
    first = exact.generate([PROMPTS[0]], SamplingParams(seed=1, **p))[0].token_ids
    again = exact.generate([PROMPTS[0]], SamplingParams(seed=1, **p))[0].token_ids
    other = exact.generate([PROMPTS[0]], SamplingParams(seed=2, **p))[0].token_ids
    assert first == again
    assert first != other


def test_sampling_ignores_global_rng_state(exact):
    params = SamplingParams(max_tokens=16, ignore_eos=True, temperature=0.8, seed=3)
    torch.manual_seed(0)
    first = exact.generate([PROMPTS[2]], params)[0].token_ids
    torch.manual_seed(12345)
    torch.rand(1000)
    assert exact.generate([PROMPTS[2]], params)[0].token_ids == first


def test_blocks_all_returned(exact):
    exact.generate(PROMPTS, SamplingParams(max_tokens=8))
    exact.check_integrity()
    assert exact.cache.num_cached > 0  # finished lanes left their whole blocks in the cache
    assert exact.pool.num_free + exact.cache.num_cached == exact.pool.num_blocks
    exact.cache.clear()
    assert exact.pool.num_free == exact.pool.num_blocks


def _attention_rows_agree(attend) -> bool:
    """Whether attend(q, k_cache, v_cache, batch) gives a query the same bits in a long prefill,
    in a chunk that starts mid-tile, beside another lane, and alone as a decode row."""
    from lanes.batch import ForwardBatch, SeqSlice

    gen = torch.Generator().manual_seed(4)
    heads, kv_heads, dim, ctx = 6, 2, 16, 300
    k_cache = torch.randn((ctx + 40, kv_heads, dim), generator=gen)
    v_cache = torch.randn((ctx + 40, kv_heads, dim), generator=gen)
    slots = torch.randperm(ctx + 40, generator=gen)[:ctx]  # scattered over the pool
    q = torch.randn((ctx, heads, dim), generator=gen)

    def run(parts: list[tuple[int, int]]) -> list[torch.Tensor]:
        """parts: (first position, number of queries) of lanes over the same context."""
        seqs, start = [], 0
        for first, n in parts:
            seqs.append(SeqSlice(start, n, first + n, slots[: first + n]))
            start += n
        rows = torch.cat([q[first : first + n] for first, n in parts])
        none = torch.zeros(0, dtype=torch.int64)
        out = attend(rows, k_cache, v_cache, ForwardBatch(none, none, none, tuple(seqs), none))
        return list(out.split([n for _, n in parts]))

    (whole,) = run([(0, ctx)])
    same = torch.equal(run([(77, 150)])[0], whole[77:227])  # a chunk starting mid-tile
    for p in (0, 63, 64, 200, ctx - 1):
        beside, alone = run([(10, 40), (p, 1)])[1], run([(p, 1)])[0]
        same &= torch.equal(alone, whole[p : p + 1]) and torch.equal(beside, alone)
    return same


def test_exact_attention_rows_keep_their_bits_across_chunks_and_tile_groups(monkeypatch):
    """Exact attention: sums over tiles past a query's position add exact zeros and each product
    has the tile's fixed shape, so its bits never depend on the chunk, the lane beside it or the
    grouping of query tiles (several groups here)."""
    import lanes.attention as attention

    monkeypatch.setattr(attention, "_TILE_PAIRS", 8)
    assert _attention_rows_agree(attention.exact_attention)


def test_negative_control_sdpa_rows_change_with_the_chunk():
    from lanes.attention import sdpa_attention

    assert not _attention_rows_agree(sdpa_attention)


@pytest.mark.parametrize("form", ["c-kernel", "weight-major", "rows-major"])
def test_exact_linear_rows_do_not_depend_on_their_company(monkeypatch, form):
    """ExactOps' linear: the C kernel for float32 weights, or where it does not serve, either
    form of the BLAS 2-row tiles (weight @ tile.T where this machine's BLAS keeps a column's
    bits, else tile @ weight.T) and for narrow weights (16-row tiles): a row's result is the same
    bits alone, second in a tile, and among 37 rows."""
    import lanes.ops as ops
    from lanes.kernels.packed_linear_cpu import available

    if form == "c-kernel" and not available():
        pytest.skip("the C kernel did not build here")
    if form != "c-kernel":
        monkeypatch.setattr(ops, "_on_float_kernel", lambda x, w: False)
    monkeypatch.setattr(ops, "WEIGHT_MAJOR", form == "weight-major")
    gen = torch.Generator().manual_seed(5)
    x = torch.randn((37, 96), generator=gen)
    for n in (1, 7, 130, 512):
        w = torch.randn((n, 96), generator=gen)
        bias = torch.randn((n,), generator=gen)
        alone = ops.ExactOps().linear(x[5:6], w, bias)
        assert torch.equal(ops.ExactOps().linear(x[4:6], w, bias)[1:], alone), n
        assert torch.equal(ops.ExactOps().linear(x, w, bias)[5:6], alone), n


def test_weight_major_tiles_only_where_the_probe_keeps_a_columns_bits(monkeypatch):
    """A weight shape whose probe fails (as MKL's does for one output row on some CPUs) keeps the
    tile @ weight.T form: its results are F.linear's over the same tiles."""
    import lanes.ops as ops

    gen = torch.Generator().manual_seed(6)
    x, w = torch.randn((4, 64), generator=gen), torch.randn((16, 64), generator=gen)
    rows_major = torch.cat([torch.nn.functional.linear(x[i : i + 2], w) for i in (0, 2)])
    monkeypatch.setattr(ops, "weight_major_is_invariant", lambda *shape: False)
    monkeypatch.setattr(ops, "_on_float_kernel", lambda x, w: False)  # the BLAS fallback
    assert torch.equal(ops.ExactOps().linear(x, w), rows_major)
