"""Every registered kernel against its reference, and batch invariance bitwise. On the CPU these
run under TRITON_INTERPRET=1 (set in conftest before Triton is imported)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from lanes.kernels import attention, delta_rule, matmul
from lanes.kernels.common import tickets
from lanes.kernels.registry import REGISTRY, attention_case

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _close(out, ref, rtol, atol):
    if isinstance(out, tuple):
        for o, r in zip(out, ref, strict=True):
            _close(o, r, rtol, atol)
        return
    if out.dtype in (torch.int64, torch.int32):
        assert torch.equal(out.cpu(), ref.cpu())
    else:
        torch.testing.assert_close(out.float(), ref.float(), rtol=rtol, atol=atol)


@pytest.mark.parametrize("spec", REGISTRY, ids=[s.name for s in REGISTRY])
def test_kernel_matches_reference(spec):
    gen = torch.Generator().manual_seed(0)
    for dtype in spec.dtypes:
        rtol, atol = spec.tolerance[dtype]
        for case in spec.cases(dtype, DEVICE, gen):
            _close(spec.run(*case), spec.ref(*case), rtol, atol)


def test_registry_is_complete():
    import lanes.kernels

    names = {s.name for s in REGISTRY}
    assert names == {
        "matmul",
        "matmul_packed",
        "silu_mul",
        "add_rms_norm",
        "rope",
        "rope_kv_write",
        "kv_write",
        "paged_attention",
        "gated_delta",
        "chunked_gated_delta",
        "gated_delta_lanes",
        "expert_matmul",
        "route_experts",
        "combine_experts",
        "greedy_tokens",
        "sample_tokens",
    }
    assert all(
        s.batch_invariant and s.ref.__name__.startswith(("ref_", "_kv_ref", "_rope_kv_ref"))
        for s in REGISTRY
    )
    assert lanes.kernels.__doc__


def test_gated_delta_rows_do_not_depend_on_the_split():
    """A lane's rows through the delta-rule kernel in one launch, or split as prefill chunks,
    decode and verify split them (the conv window and state carried from launch to launch):
    every row and the final state bitwise equal; and a prefix run without outputs (how a
    verify step is settled) leaves the state the carried one has there."""
    from lanes.kernels.registry import _delta_cases

    gen = torch.Generator().manual_seed(3)
    mixed, z, b, a, conv, state, w = _delta_cases(torch.float32, DEVICE, gen)[2]  # 9 rows
    whole, conv_end, state_end = delta_rule.gated_delta(mixed, z, b, a, conv, state, w)
    for cuts in ([4, 5], [1, 1, 7], [3, 3, 3]):
        c, s, start, parts = conv, state, 0, []
        for n in cuts:
            rows = slice(start, start + n)
            out, c, s = delta_rule.gated_delta(mixed[rows], z[rows], b[rows], a[rows], c, s, w)
            parts.append(out)
            start += n
            prefix = slice(0, start)
            _, pc, ps = delta_rule.gated_delta(
                mixed[prefix], None, b[prefix], a[prefix], conv, state, w
            )
            assert torch.equal(ps, s) and torch.equal(pc, c)
        assert torch.equal(torch.cat(parts), whole), cuts
        assert torch.equal(s, state_end) and torch.equal(c, conv_end)
    # negative control: the state carried but not the conv window, and the later rows change
    first, _, s = delta_rule.gated_delta(mixed[:4], z[:4], b[:4], a[:4], conv, state, w)
    rest, _, _ = delta_rule.gated_delta(
        mixed[4:], z[4:], b[4:], a[4:], torch.zeros_like(conv), s, w
    )
    assert torch.equal(first, whole[:4]) and not torch.equal(rest, whole[4:])


@pytest.mark.parametrize("advance", [True, False], ids=["decode", "verify"])
def test_gated_delta_lanes_give_each_lane_its_own_bits(advance):
    """Lanes whose states sit in pool slots (a CUDA graph's form) get, row for row, the bits
    the one-lane launch gives each alone; with `advance` each slot then holds that lane's
    state after its rows, without it the pools are untouched; slots no lane names never are.
    Negative control: the same rows read through other slots come out different."""
    from lanes.kernels.registry import _delta_lanes_cases

    gen = torch.Generator().manual_seed(4)
    case = _delta_lanes_cases(torch.float32, DEVICE, gen)[1]  # 2 lanes of 4 rows, slots 3, 0
    mixed, z, b, a, conv_pool, state_pool, slots, t, w, _ = case
    conv_in, state_in = conv_pool.clone(), state_pool.clone()
    out = delta_rule.gated_delta_lanes(mixed, z, b, a, conv_pool, state_pool, slots, t, w, advance)
    for lane, slot in enumerate(slots.tolist()):
        rows = slice(lane * t, (lane + 1) * t)
        alone, c, s = delta_rule.gated_delta(
            mixed[rows], z[rows], b[rows], a[rows], conv_in[slot], state_in[slot], w
        )
        assert torch.equal(out[rows], alone)
        want_c, want_s = (c, s) if advance else (conv_in[slot], state_in[slot])
        assert torch.equal(conv_pool[slot], want_c) and torch.equal(state_pool[slot], want_s)
    for slot in (1, 2, 4):
        assert torch.equal(conv_pool[slot], conv_in[slot])
        assert torch.equal(state_pool[slot], state_in[slot])
    other = delta_rule.gated_delta_lanes(
        mixed, z, b, a, conv_in, state_in, slots.flip(0), t, w, False
    )
    assert not torch.equal(other, out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n, k", [(64, 512), (128, 512)])
def test_matmul_rows_do_not_depend_on_m(dtype, n, k):
    """Split-K shapes: the parallel segments reduced in-kernel by the last arrival (at most 64
    rows), and the one-program path above."""
    gen = torch.Generator().manual_seed(1)
    assert matmul.split_for(n, k, DEVICE, dtype) > 1
    w = (torch.randn((n, k), generator=gen) * k**-0.5).to(DEVICE, dtype)
    bias = torch.randn((n,), generator=gen).to(DEVICE, dtype)
    x = torch.randn((128, k), generator=gen).to(DEVICE, dtype)
    row = x[5:6]
    alone = matmul.matmul(row, w, bias)
    for m in (37, 128):
        batch = torch.cat([x[:5], row, x[6:m]])
        assert torch.equal(matmul.matmul(batch, w, bias)[5:6], alone), m
    assert not tickets(torch.device(DEVICE), 1, "matmul").any()  # every ticket back at zero


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_kv_write_rows_do_not_depend_on_t(dtype):
    """A token's rotated q, and the k and v written at its slot, are the same bits in a launch of
    many tokens (heads over several programs, per-head norms) as alone."""
    from lanes.kernels import rope
    from lanes.kernels.registry import _rope_kv_cases

    gen = torch.Generator().manual_seed(4)
    q, k, v, cos, sin, k_cache, v_cache, slots, norms, eps = _rope_kv_cases(dtype, DEVICE, gen)[2]
    kc, vc = k_cache.clone(), v_cache.clone()
    whole = rope.rope_kv_write(q, k, v, cos, sin, kc, vc, slots, norms, eps)
    for i in range(q.shape[0]):
        one = slice(i, i + 1)
        kc1, vc1 = k_cache.clone(), v_cache.clone()
        alone = rope.rope_kv_write(
            q[one], k[one], v[one], cos[one], sin[one], kc1, vc1, slots[one], norms, eps
        )
        assert torch.equal(alone, whole[one]), i
        assert torch.equal(kc1[slots[one]], kc[slots[one]]), i
        assert torch.equal(vc1[slots[one]], vc[slots[one]]), i


def _packed_case(dtype, n: int, k: int, rows: int, bits: int = 4):
    """rows x [rows, k] and a [n, k] PackedWeight of random codes (groups of 64) whose weights
    centre on zero, about k**-0.5 in size."""
    from lanes.packed import PackedWeight

    gen = torch.Generator().manual_seed(3)
    codes = torch.randint(0, 2**32, (n, k * bits // 32), generator=gen, dtype=torch.int64)
    scales = (torch.rand((n, k // 64), generator=gen) * k**-0.5 / 2**bits).to(DEVICE, dtype)
    biases = -scales * (2**bits - 1) / 2
    w = PackedWeight(codes.to(torch.uint32).to(DEVICE), scales, biases, bits, 64)
    return torch.randn((rows, k), generator=gen).to(DEVICE, dtype), w


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_matmul_rows_do_not_depend_on_m(dtype):
    """4-bit MLX codes dequantized in the kernel: the split-K path and the one-program path, and
    the decode, few-rows and prefill tiles, give a row the same bits. On a GPU at an 8B-like
    K (the warpgroup tiles H200 call 3 found changing bits passed at K = 512)."""
    n, k, ms = (512, 4096, (37, 300)) if DEVICE == "cuda" else (64, 512, (37, 128))
    assert matmul.split_for(n, k, DEVICE, dtype, packed=True) > 1
    x, w = _packed_case(dtype, n, k, max(ms))
    for row in (0, 5, 36):
        alone = matmul.matmul(x[row : row + 1], w)
        for m in ms:
            assert torch.equal(matmul.matmul(x[:m], w)[row : row + 1], alone), (row, m)


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_packed_matmul_on_each_tile_shape_matches_the_reference(bits):
    """The decode, few-rows and prefill tiles (the prefill one with the weight on the left) all
    compute x @ w.T; on the CPU only the decode tile runs in the engine, so the others are
    checked here directly."""
    from lanes.kernels import packed_matmul

    x, w = _packed_case(torch.float32, 96, 256, 40, bits)
    want = matmul.ref_matmul(x, w)
    tiles = (packed_matmul.DECODE_TILES, packed_matmul.FEW_ROWS_TILES, packed_matmul.PREFILL_TILES)
    for t in tiles:
        got = packed_matmul.packed_matmul(x, w, None, t)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=str(t))


@pytest.mark.skipif(DEVICE != "cuda", reason="warpgroup MMA tiles need a Hopper GPU")
def test_negative_control_packed_rows_on_warpgroup_tiles():
    """The tile rule's control: 64-row tiles of 4 warps (Hopper's warpgroup MMA) give some row
    other bits than the decode tile does."""
    from lanes.kernels import packed_matmul

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("warpgroup MMA is Hopper's")
    x, w = _packed_case(torch.bfloat16, 512, 4096, 37)
    decode = torch.cat([matmul.matmul(x[r : r + 1], w) for r in range(37)])
    warpgroup = packed_matmul.packed_matmul(x, w, None, packed_matmul.PackedTiles(64))
    assert not torch.equal(warpgroup, decode)


def _chunks() -> tuple[int, ...]:
    """Chunk sizes for the split test. On a GPU, any: the MMA treats every row of a tile alike.
    The CPU interpreter's numpy matmul rounds a row differently depending on its position in the
    tile, so there the last query is kept at the same row (chunk = 1 mod BLOCK_Q, BLOCK_Q = 32)
    while the boundary between cached and chunk keys still moves across key tiles."""
    return (1, 7, 64, 65, 128, 150) if DEVICE == "cuda" else (1, 33, 65, 97, 129)


def test_attention_query_split_between_cache_and_chunk():
    """One lane's last query gets the same bits whether its keys were all in the cache (decode)
    or partly in the same chunk, for several chunk boundaries."""
    gen = torch.Generator().manual_seed(2)
    ctx = 150
    q, k_cache, v_cache, seqs = attention_case(torch.float32, DEVICE, gen, [(ctx, ctx)], 4, 2, 32)
    _, _, _, slots = seqs[0]
    outs = []
    for chunk in _chunks():  # the last `chunk` queries computed together
        first = ctx - chunk
        sub = [(0, chunk, ctx, slots)]
        meta = attention.make_meta(sub, 2, DEVICE)
        outs.append(attention.paged_attention(q[first:].contiguous(), k_cache, v_cache, meta)[-1])
    for o in outs[1:]:
        assert torch.equal(o, outs[0])
    # and with other lanes in the same call
    other_q, _, _, _ = attention_case(torch.float32, DEVICE, gen, [(3, 3)], 4, 2, 32)
    both = [(0, 3, 3, slots[:3]), (3, 1, ctx, slots)]
    meta = attention.make_meta(both, 2, DEVICE)
    mixed = attention.paged_attention(
        torch.cat([other_q, q[-1:]]).contiguous(), k_cache, v_cache, meta
    )
    assert torch.equal(mixed[-1], outs[0])


# key tiles of 16 in partitions of 2 tiles: many partitions at the contexts of these tests
SMALL_TILES = dict(block_n=16, part_tiles=2)


def test_attention_partitions_split_or_merged_in_one_program_agree():
    """Decode and verify rows: the key partitions computed by parallel programs and merged by the
    last to arrive give the bits of one program merging them as it walks; both near the plain
    softmax. Other partitions give other bits (what the equality rests on is the partitioning
    and the merge's arithmetic, not a trivially shared computation)."""
    gen = torch.Generator().manual_seed(5)
    q, k_cache, v_cache, seqs = attention_case(
        torch.float32, DEVICE, gen, [(1, 150), (5, 97), (1, 20), (3, 33)], 4, 2, 32
    )
    meta = attention.make_meta(seqs, 2, DEVICE)
    one = attention.paged_attention(q, k_cache, v_cache, meta, split=False, **SMALL_TILES)
    split = attention.paged_attention(q, k_cache, v_cache, meta, split=True, **SMALL_TILES)
    assert torch.equal(one, split)
    assert not tickets(torch.device(DEVICE), 1, "attention").any()  # every ticket back at zero
    ref = attention.ref_paged_attention(q, k_cache, v_cache, seqs)
    torch.testing.assert_close(one, ref, rtol=1e-4, atol=1e-5)
    other = attention.paged_attention(q, k_cache, v_cache, meta, block_n=16, part_tiles=3)
    assert not torch.equal(other, one)
    # by default a forward of few programs over several partitions splits
    assert attention.paged_attention(q, k_cache, v_cache, meta, block_n=16, part_tiles=2).equal(
        split
    )


def test_a_chunk_deep_in_a_prompt_beside_decode_rows_splits_with_the_same_bits():
    """A mixed round's forward: short decode lanes, then a prompt chunk with a long context.
    Only the chunk's tiles count as long, so the forward splits their partitions over programs
    however many decode lanes there are; the rows get the bits of one program per tile."""
    gen = torch.Generator().manual_seed(8)
    q, k_cache, v_cache, seqs = attention_case(
        torch.float32, DEVICE, gen, [(1, 9), (1, 12), (1, 7), (40, 150)], 4, 2, 32
    )
    meta = attention.make_meta(seqs, 2, DEVICE)
    assert meta.long_tiles == -(-40 // meta.block_q)
    walked = attention.paged_attention(q, k_cache, v_cache, meta, split=False, **SMALL_TILES)
    split = attention.paged_attention(q, k_cache, v_cache, meta, split=True, **SMALL_TILES)
    assert torch.equal(walked, split)
    torch.testing.assert_close(
        walked, attention.ref_paged_attention(q, k_cache, v_cache, seqs), rtol=1e-4, atol=1e-5
    )


def test_attention_decode_split_equals_the_prefill_row():
    """A lane's last query: decoded with its partitions split over programs, or computed inside
    prefill chunks of several sizes (partitions merged in registers, chunk boundaries anywhere
    among them): the same bits."""
    gen = torch.Generator().manual_seed(6)
    ctx = 150
    q, k_cache, v_cache, seqs = attention_case(torch.float32, DEVICE, gen, [(ctx, ctx)], 4, 2, 32)
    slots = seqs[0][3]
    decode = attention.paged_attention(
        q[-1:].contiguous(), k_cache, v_cache, attention.make_meta([(0, 1, ctx, slots)], 2, DEVICE),
        split=True, **SMALL_TILES,
    )  # fmt: skip
    for chunk in _chunks():
        meta = attention.make_meta([(0, chunk, ctx, slots)], 2, DEVICE)
        prefill = attention.paged_attention(
            q[ctx - chunk :].contiguous(), k_cache, v_cache, meta, split=False, **SMALL_TILES
        )
        assert torch.equal(prefill[-1:], decode), chunk


def test_engine_on_triton_kernels_matches_transformers(tiny_models):
    """The whole decoder on the Triton ops (interpreted on the CPU): greedy tokens equal
    transformers', and a lane's output is the same alone and batched. In float32 on a GPU too:
    transformers runs in float32 on the CPU, and bf16 rounding flips a near tie of this random
    model (token 5 differed on the H200, before and after the fused kernels)."""
    from lanes import EngineConfig, SamplingParams, build_engine

    path, hf = tiny_models["qwen2"]
    config = EngineConfig(kernels="triton", device=DEVICE, dtype="float32")
    engine = build_engine(str(path), config)
    assert engine.ops.name == "triton"
    ids = engine.tokenizer.encode("The quick brown fox jumps over")
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    (out,) = engine.generate([ids], params)
    hf.generation_config.eos_token_id = None
    with torch.no_grad():
        ref = hf.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False, pad_token_id=0)[
            0, len(ids) :
        ]
    assert out.token_ids == ref.tolist()
    batched = engine.generate([ids[:3], ids, ids[:5]], params)[1]
    assert batched.token_ids == out.token_ids


def test_device_sampling_keeps_the_equalities(tiny_models, monkeypatch):
    """With the Triton kernels, the greedy rows of every forward are sampled in one launch (one
    read-back): batched == solo and drafted == undrafted hold on that path, and its logprobs are
    the log-softmax of the same logits."""
    import dataclasses

    import lanes.verifier
    from lanes import EngineConfig, SamplingParams, build_engine
    from lanes.drafter.replay import ReplayProposer
    from lanes.sampling import sampling_logprobs

    launches = []
    sample_rows = lanes.verifier.sample_rows
    monkeypatch.setattr(
        "lanes.verifier.sample_rows", lambda *a, **k: launches.append(1) or sample_rows(*a, **k)
    )
    path, _ = tiny_models["llama"]
    # k from acceptance, not from measured costs: on a GPU those can turn drafting off
    config = EngineConfig(
        kernels="triton", device=DEVICE, prefill_chunk=32, cost_aware_drafts=False
    )
    engine = build_engine(str(path), config)
    assert engine.ops.name == "triton"
    prompts = [[11, 12, 13, 14] * 4, [20 + i % 7 for i in range(24)]]
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    undrafted = dataclasses.replace(params, draft=False)
    (solo,) = engine.generate(prompts[:1], undrafted, cache_salt="solo")
    assert launches  # the device path ran
    batched = engine.generate(prompts, undrafted, cache_salt="batched")
    assert [len(o.token_ids) for o in [solo, *batched]] == [8, 8, 8]
    assert batched[0].token_ids == solo.token_ids
    records = {tuple(p): o.token_ids for p, o in zip(prompts, batched, strict=True)}
    engine.proposer = ReplayProposer(records, 0.7, engine.model_config.vocab_size)
    drafted = engine.generate(prompts, params, cache_salt="drafted")
    assert [o.token_ids for o in drafted] == [o.token_ids for o in batched]
    assert sum(o.num_accepted for o in drafted) > 0  # drafts were verified on the device path
    rows = engine.prompt_logits([prompts[0] + solo.token_ids])[0][len(prompts[0]) - 1 : -1]
    want = [
        float(sampling_logprobs(r, params)[t]) for r, t in zip(rows, solo.token_ids, strict=True)
    ]
    torch.testing.assert_close(
        torch.tensor(solo.logprobs), torch.tensor(want), rtol=1e-4, atol=1e-4
    )


def _seeded_engine(tiny_models, monkeypatch):
    """A Triton engine whose sampling-kernel launches are counted (their row counts)."""
    import lanes.kernels.sampling
    from lanes import EngineConfig, build_engine

    launched = []
    sample_with = lanes.kernels.sampling.sample_with

    def counted(logits, *args):
        launched.append(logits.shape[0])
        return sample_with(logits, *args)

    monkeypatch.setattr(lanes.kernels.sampling, "sample_with", counted)
    config = EngineConfig(
        kernels="triton", device=DEVICE, prefill_chunk=32, cost_aware_drafts=False
    )
    return build_engine(str(tiny_models["llama"][0]), config), launched


_SEEDED_PROMPTS = [[11, 12, 13, 14] * 4, [20 + i % 7 for i in range(24)], [5, 9, 200, 31] * 3]


def _seeded_params():
    from lanes import SamplingParams

    base = SamplingParams(max_tokens=8, ignore_eos=True, draft=False, temperature=0.8, seed=5)
    return [
        dataclasses.replace(base, top_p=0.9),
        dataclasses.replace(base, temperature=1.2, top_k=20, seed=6),
        dataclasses.replace(base, temperature=0.6, top_k=30, top_p=0.8, seed=7),
    ]


def _replay_drafted(engine, outputs, acceptance=0.6):
    """Drafts that are the recorded output with the given chance, else a wrong token."""
    from lanes.drafter.replay import ReplayProposer

    records = {tuple(p): o.token_ids for p, o in zip(_SEEDED_PROMPTS, outputs, strict=True)}
    engine.proposer = ReplayProposer(records, acceptance, engine.model_config.vocab_size)
    params = [dataclasses.replace(p, draft=True) for p in _seeded_params()]
    return [
        engine.generate([q], p, cache_salt="drafted")[0]
        for q, p in zip(_SEEDED_PROMPTS, params, strict=True)
    ]


def test_seeded_rows_sampled_on_the_device_keep_the_equalities(tiny_models, monkeypatch):
    """Seeded rows (temperature with top-k and/or top-p) of every forward are sampled in one
    launch of the position-keyed kernel with the greedy ones: solo == batched == drafted,
    token for token, and each token's logprob is that of the host's distribution."""
    from lanes.sampling import sampling_logprobs

    engine, launched = _seeded_engine(tiny_models, monkeypatch)
    params = _seeded_params()
    solo = [
        engine.generate([q], p, cache_salt=f"solo{i}")[0]
        for i, (q, p) in enumerate(zip(_SEEDED_PROMPTS, params, strict=True))
    ]
    assert launched  # the kernel sampled them
    launched.clear()
    batched = [
        engine.add_request(q, p, cache_salt="b")
        for q, p in zip(_SEEDED_PROMPTS, params, strict=True)
    ]
    done = {}
    while engine.has_work():
        done.update((c.request_id, c) for c in engine.step())
    batched = [done[i] for i in batched]
    assert max(launched) == len(_SEEDED_PROMPTS)  # every lane's row in one launch
    assert [o.token_ids for o in batched] == [o.token_ids for o in solo]
    drafted = _replay_drafted(engine, solo)
    assert [o.token_ids for o in drafted] == [o.token_ids for o in solo]
    assert sum(o.num_accepted for o in drafted) > 0
    assert sum(o.num_drafted - o.num_accepted for o in drafted) > 0  # and some were rejected
    for q, p, o in zip(_SEEDED_PROMPTS, params, solo, strict=True):
        rows = engine.prompt_logits([q + o.token_ids])[0][len(q) - 1 : -1]
        want = [float(sampling_logprobs(r, p)[t]) for r, t in zip(rows, o.token_ids, strict=True)]
        torch.testing.assert_close(
            torch.tensor(o.logprobs), torch.tensor(want), rtol=1e-4, atol=1e-4
        )


def test_negative_control_seeded_verify_rows_at_wrong_positions(tiny_models, monkeypatch):
    """The noise is keyed by each row's position: verify rows sampled at the step's last
    position instead of their own change the drafted output, so the equality above would fail."""
    from lanes.rounds import Step

    engine, _ = _seeded_engine(tiny_models, monkeypatch)
    solo = [
        engine.generate([q], p, cache_salt=f"solo{i}")[0]
        for i, (q, p) in enumerate(zip(_SEEDED_PROMPTS, _seeded_params(), strict=True))
    ]
    monkeypatch.setattr(Step, "first_sample_position", property(lambda s: s.end))
    drafted = _replay_drafted(engine, solo, acceptance=0.9)
    assert [o.token_ids for o in drafted] != [o.token_ids for o in solo]


def test_greedy_rows_have_the_same_bits_in_both_sampling_kernels():
    """A greedy row's token and logprob do not depend on whether seeded rows share its launch
    (sample_tokens) or not (greedy_tokens): both kernels run the one _greedy_row."""
    from lanes.kernels.sampling import greedy_tokens, sample_tokens

    gen = torch.Generator().manual_seed(3)
    logits = (torch.randn((5, 3000), generator=gen) * 3).to(torch.bfloat16).float().to(DEVICE)
    temps = torch.tensor([0.0, 0.8, 0.0, 1.1, 0.0])
    top_k = torch.tensor([0, 20, 0, 0, 0])
    top_p = torch.tensor([1.0, 0.9, 1.0, 0.8, 1.0])
    mixed = sample_tokens(logits, temps, top_k, top_p, [1, 2, 3, 4, 5], [9, 9, 9, 9, 9])
    alone = greedy_tokens(logits)
    for i in (0, 2, 4):
        assert torch.equal(mixed[0][i], alone[0][i]) and torch.equal(mixed[1][i], alone[1][i])


def test_launch_choices_follow_the_device_and_dtype_never_the_rows(monkeypatch):
    """Which layouts a launch takes: the tensor-descriptor prefill tiles only on Hopper-class
    GPUs for float16/bfloat16 (chosen by the weight's width), wide attention programs only for
    long bf16/fp16 forwards on a GPU, programmatic dependent launch only on Hopper-class GPUs
    and never with LANES_PDL=0; on the CPU (and the interpreter) none of them."""
    from lanes.kernels import common

    cpu = torch.device("cpu")
    x = torch.zeros((128, 64), dtype=torch.bfloat16)
    w = torch.zeros((64, 64), dtype=torch.bfloat16)
    assert matmul.prefill_tiles_for(x, w) is None
    assert common.pdl_launch(cpu) == {"PDL": False}
    assert attention.rows_for(4096, torch.bfloat16, cpu) == attention.BLOCK_ROWS
    if DEVICE == "cuda" and torch.cuda.get_device_capability()[0] >= 9:
        gpu = torch.device("cuda")
        xg, wide = x.cuda(), torch.zeros((16384, 64), dtype=torch.bfloat16, device="cuda")
        assert matmul.prefill_tiles_for(xg, w.cuda()).block_n == 256
        assert matmul.prefill_tiles_for(xg, wide).block_m == 256
        assert matmul.prefill_tiles_for(xg.float(), w.cuda().float()) is None
        assert attention.rows_for(4096, torch.bfloat16, gpu) == attention.WIDE_ROWS
        assert attention.rows_for(64, torch.bfloat16, gpu) == attention.BLOCK_ROWS
        assert attention.rows_for(4096, torch.float32, gpu) == attention.BLOCK_ROWS
        assert common.pdl_launch(gpu)["PDL"]
        monkeypatch.setenv("LANES_PDL", "0")
        assert common.pdl_launch(gpu) == {"PDL": False}


def test_expert_matmul_slots_do_not_depend_on_the_batch():
    """A token's expert outputs alone, and in batches where its slots sit at other places of
    their tiles and share them with other tokens' slots: bitwise equal; the down projection's
    form (slots already in order, one row each) too."""
    from lanes.kernels.expert_matmul import expert_matmul, expert_tiles

    gen = torch.Generator().manual_seed(4)
    e, k, n, depth = 6, 2, 40, 128
    for dtype in (torch.float32, torch.bfloat16):
        w = (torch.randn((e, 64, depth), generator=gen) * depth**-0.5).to(DEVICE, dtype)
        x = torch.randn((n, depth), generator=gen).to(DEVICE, dtype)
        experts = torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(n)]).to(DEVICE)
        token = 9
        alone = expert_matmul(x[token : token + 1], w, expert_tiles(experts[token], e), k)
        for m in (10, 25, n):
            batch = expert_matmul(x[:m], w, expert_tiles(experts[:m].reshape(-1), e), k)
            assert torch.equal(batch[token * k : token * k + k], alone), (dtype, m)
        # slots already in order (one row each): the token's two slots behind two others of
        # the same experts, so each sits second in its tile
        rows = torch.cat([x[20 : 20 + k], x[token : token + 1].repeat(k, 1)])
        slots_experts = experts[token].repeat(2)
        down = expert_matmul(rows, w, expert_tiles(slots_experts, e), 1)
        first = expert_matmul(rows[k:], w, expert_tiles(experts[token], e), 1)
        assert torch.equal(down[k:], first)


def test_routing_and_the_weighted_sum_do_not_depend_on_the_batch():
    """A token's experts, weights and weighted sum alone and among 37 tokens: bitwise equal."""
    from lanes.kernels.moe_route import combine_experts, route_experts

    gen = torch.Generator().manual_seed(5)
    n, e, k, hidden = 37, 64, 4, 200
    for dtype in (torch.float32, torch.bfloat16):
        logits = (torch.randn((n, e), generator=gen) * 3).to(DEVICE, dtype)
        outputs = torch.randn((n * k, hidden), generator=gen).to(DEVICE, dtype)
        weights, experts = route_experts(logits, k, True)
        total = combine_experts(outputs, weights.to(dtype))
        for token in (0, 17, n - 1):
            w, x = route_experts(logits[token : token + 1], k, True)
            assert torch.equal(w, weights[token : token + 1])
            assert torch.equal(x, experts[token : token + 1])
            rows = outputs[token * k : token * k + k]
            alone = combine_experts(rows, w.to(dtype))
            assert torch.equal(alone, total[token : token + 1]), (dtype, token)
