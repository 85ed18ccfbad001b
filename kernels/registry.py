"""Every kernel with its contract: dtypes, limits, batch invariance, its reference, tolerance,
and how to make fresh random inputs for it. tests/test_kernels.py walks this list, so no kernel
ships untested; `lanes kernels` prints it with each kernel's last GPU check."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from lanes.kernels import (
    activation,
    attention,
    chunked_delta,
    delta_rule,
    expert_matmul,
    kv_write,
    matmul,
    moe_route,
    rmsnorm,
    rope,
    sampling,
)

Case = tuple  # positional arguments for both the kernel and its reference


@dataclass(frozen=True)
class KernelSpec:
    name: str
    run: Callable
    ref: Callable
    dtypes: tuple[torch.dtype, ...]
    batch_invariant: bool
    limits: str
    tolerance: dict[torch.dtype, tuple[float, float]]  # (rtol, atol) against the reference
    cases: Callable[[torch.dtype, str, torch.Generator], list[Case]]


def _rand(shape, dtype, device, gen, scale=1.0):
    return (torch.randn(shape, generator=gen) * scale).to(device=device, dtype=dtype)


def _matmul_cases(dtype, device, gen):
    out = []
    for m, n, k, bias in [
        (1, 64, 128, False),
        (37, 96, 256, True),
        (128, 130, 64, False),
        (5, 512, 1024, True),
        (3, 96, 1024, False),  # narrow: 32-column tiles, split K
    ]:
        out.append(
            (
                _rand((m, k), dtype, device, gen),
                _rand((n, k), dtype, device, gen, k**-0.5),
                _rand((n,), dtype, device, gen) if bias else None,
            )
        )
    return out


def _packed_cases(dtype, device, gen):
    """MLX affine codes of 2, 4 and 8 bits: random words, scales and biases."""
    from lanes.packed import PackedWeight

    out = []
    for m, n, k, bits, group in [(1, 96, 128, 4, 64), (19, 64, 256, 8, 32), (5, 40, 128, 2, 64)]:
        words = torch.randint(0, 2**32, (n, k * bits // 32), generator=gen, dtype=torch.int64)
        codes = words.to(torch.uint32).to(device)
        # weights centred on zero, about k**-0.5 in size: outputs stay O(1)
        scale = torch.rand((n, k // group), generator=gen) * k**-0.5 / 2**bits
        scales = scale.to(device, dtype)
        biases = (-scale * (2**bits - 1) / 2).to(device, dtype)
        out.append(
            (
                _rand((m, k), dtype, device, gen),
                PackedWeight(codes, scales, biases, bits, group),
                None,
            )
        )
    return out


def _silu_mul_cases(dtype, device, gen):
    return [(_rand((m, 2 * i), dtype, device, gen, 3.0),) for m, i in [(1, 64), (7, 1500)]]


def _norm_cases(dtype, device, gen):
    return [
        (
            _rand((m, d), dtype, device, gen),
            _rand((m, d), dtype, device, gen) if res else None,
            _rand((d,), dtype, device, gen),
            1e-5,
        )
        for m, d, res in [(1, 64, True), (19, 96, False), (33, 576, True)]
    ]


def _rope_cases(dtype, device, gen):
    out = []
    for t, h, d in [(1, 4, 16), (23, 3, 64), (9, 8, 128)]:
        ang = torch.rand((t, d // 2), generator=gen) * 6.28
        out.append(
            (_rand((t, h, d), dtype, device, gen), ang.cos().to(device), ang.sin().to(device))
        )
    return out


def _kv_cases(dtype, device, gen):
    out = []
    for t, s, h, d in [(1, 32, 2, 16), (17, 64, 3, 64)]:
        slots = torch.randperm(s, generator=gen)[:t].to(device)
        out.append(
            (
                torch.zeros((s, h, d), dtype=dtype, device=device),
                torch.zeros((s, h, d), dtype=dtype, device=device),
                slots,
                _rand((t, h, d), dtype, device, gen),
                _rand((t, h, d), dtype, device, gen),
            )
        )
    return out


def _kv_run(k_cache, v_cache, slots, k, v):
    kc, vc = k_cache.clone(), v_cache.clone()
    kv_write.kv_write(kc, vc, slots, k, v)
    return kc, vc


def _kv_ref(k_cache, v_cache, slots, k, v):
    kc, vc = k_cache.clone(), v_cache.clone()
    kv_write.ref_kv_write(kc, vc, slots, k, v)
    return kc, vc


def _rope_kv_cases(dtype, device, gen):
    """Column views of one fused qkv output, as the decoder passes them; with and without the
    per-head norms (Qwen3)."""
    out = []
    for t, hq, hkv, d, s, norm in [
        (1, 4, 2, 16, 32, False),
        (13, 6, 2, 64, 64, True),
        (5, 9, 3, 32, 32, True),  # query heads over two programs (8 + 1)
    ]:
        qkv = _rand((t, (hq + 2 * hkv) * d), dtype, device, gen)
        q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
        ang = torch.rand((t, d // 2), generator=gen) * 6.28
        norms = (_rand((d,), dtype, device, gen), _rand((d,), dtype, device, gen)) if norm else None
        out.append(
            (
                q.view(t, hq, d),
                k.view(t, hkv, d),
                v.view(t, hkv, d),
                ang.cos().to(device),
                ang.sin().to(device),
                torch.zeros((s, hkv, d), dtype=dtype, device=device),
                torch.zeros((s, hkv, d), dtype=dtype, device=device),
                torch.randperm(s, generator=gen)[:t].to(device),
                norms,
                1e-6,
            )
        )
    return out


def _rope_kv_run(q, k, v, cos, sin, k_cache, v_cache, slots, norms, eps):
    kc, vc = k_cache.clone(), v_cache.clone()
    return rope.rope_kv_write(q, k, v, cos, sin, kc, vc, slots, norms, eps), kc, vc


def _rope_kv_ref(q, k, v, cos, sin, k_cache, v_cache, slots, norms, eps):
    kc, vc = k_cache.clone(), v_cache.clone()
    return rope.ref_rope_kv_write(q, k, v, cos, sin, kc, vc, slots, norms, eps), kc, vc


def attention_case(dtype, device, gen, lanes, hq, hkv, d, num_slots=512):
    """A paged batch: lanes = [(num_queries, context_len)], slots scattered over the pool."""
    k_cache = _rand((num_slots, hkv, d), dtype, device, gen)
    v_cache = _rand((num_slots, hkv, d), dtype, device, gen)
    perm = torch.randperm(num_slots, generator=gen).to(device)
    seqs, used, rows = [], 0, 0
    for nq, cl in lanes:
        seqs.append((rows, nq, cl, perm[used : used + cl]))
        used += cl
        rows += nq
    return _rand((rows, hq, d), dtype, device, gen), k_cache, v_cache, seqs


def _attention_cases(dtype, device, gen):
    return [
        attention_case(dtype, device, gen, [(1, 1), (5, 70), (1, 130)], 4, 2, 16),
        attention_case(dtype, device, gen, [(40, 40), (3, 200)], 6, 2, 32),
        attention_case(dtype, device, gen, [(17, 100)], 9, 3, 64),
    ]


def _attention_run(q, k_cache, v_cache, seqs):
    meta = attention.make_meta(seqs, q.shape[1] // k_cache.shape[1], q.device)
    return attention.paged_attention(q, k_cache, v_cache, meta)


def _greedy_cases(dtype, device, gen):
    # well-separated maxima: the reference's argmax after log_softmax sees no rounding tie
    out = []
    for r, v in [(1, 300), (5, 20000)]:
        logits = _rand((r, v), torch.float32, device, gen, 3.0)
        logits[torch.arange(r), torch.randint(0, v, (r,), generator=gen).to(device)] += 10.0
        out.append((logits,))
    return out


def _sampling_cases(dtype, device, gen):
    out = []
    for r, v, ties in [(4, 300, None), (3, 2000, None), (6, 3000, "bf16"), (6, 500, "round")]:
        logits = _rand((r, v), torch.float32, device, gen, 3.0)
        if ties == "bf16":  # logits as a bf16 LM head writes them: many equal values
            logits = logits.to(torch.bfloat16).float()
        elif ties == "round":  # ties everywhere, at the top-k and nucleus edges too
            logits = torch.round(logits)
        temps = torch.tensor([0.0, 0.7, 1.0, 1.3, 0.5, 0.9][:r])
        top_k = torch.tensor([0, 0, 20, 5, 1, 40][:r], dtype=torch.int32)
        top_p = torch.tensor([1.0, 0.9, 1.0, 0.5, 0.3, 0.95][:r])
        seeds = [int(torch.randint(0, 2**62, (1,), generator=gen)) for _ in range(r)]
        positions = [int(torch.randint(0, 10**6, (1,), generator=gen)) for _ in range(r)]
        out.append((logits, temps, top_k, top_p, seeds, positions))
    return out


def _delta_weights(dtype, device, gen, hk=2, hv=4, d=16, kernel=4):
    """A DeltaNet layer's recurrence weights (2 key heads over 4 value heads, dk = dv = 16, a
    4-tap conv)."""
    from lanes.kernels.delta_rule import DeltaRuleWeights

    conv_dim = 2 * hk * d + hv * d
    return DeltaRuleWeights(
        taps=_rand((conv_dim, kernel), torch.float32, device, gen, 0.5),
        neg_a=-torch.rand(hv, generator=gen).to(device),
        dt_bias=_rand((hv,), torch.float32, device, gen),
        norm=(1 + _rand((d,), torch.float32, device, gen, 0.1)).to(dtype),
        key_heads=hk,
        value_heads=hv,
        key_dim=d,
        value_dim=d,
        eps=1e-6,
    )


def _delta_rows(w, rows, dtype, device, gen):
    """(mixed, z, b, a): views of one projection's rows, as in the model."""
    conv_dim, hv, d = w.taps.shape[0], w.value_heads, w.value_dim
    fused = _rand((rows, conv_dim + hv * d + 2 * hv), dtype, device, gen)
    return fused.split([conv_dim, hv * d, hv, hv], dim=1)


def _delta_cases(dtype, device, gen):
    """One lane's rows through a DeltaNet layer: 1, 5 and 9 rows."""
    out = []
    for rows in (1, 5, 9):
        w = _delta_weights(dtype, device, gen)
        conv = _rand((w.taps.shape[0], w.taps.shape[1] - 1), torch.float32, device, gen)
        state = _rand((w.value_heads, w.key_dim, w.value_dim), torch.float32, device, gen, 0.1)
        out.append((*_delta_rows(w, rows, dtype, device, gen), conv, state, w))
    return out


def _delta_lanes_cases(dtype, device, gen):
    """Lanes in pool slots out of order: 3 lanes of 1 row (decode, advancing) and 2 lanes of 4
    rows (verify: the pools only read)."""
    out = []
    for lanes, rows, advance in ((3, 1, True), (2, 4, False)):
        w = _delta_weights(dtype, device, gen)
        conv_pool = _rand((5, w.taps.shape[0], w.taps.shape[1] - 1), torch.float32, device, gen)
        state_pool = _rand(
            (5, w.value_heads, w.key_dim, w.value_dim), torch.float32, device, gen, 0.1
        )
        slots = torch.tensor([3, 0, 4][:lanes], dtype=torch.int64, device=device)
        mixed, z, b, a = _delta_rows(w, lanes * rows, dtype, device, gen)
        out.append((mixed, z, b, a, conv_pool, state_pool, slots, rows, w, advance))
    return out


def _chunked_delta_cases(dtype, device, gen):
    """One lane's rows through the chunked form: 5 rows from a chunk start, and 90 rows after
    30 carried ones (crossing two chunk boundaries)."""
    from lanes.kernels.chunked_delta import ChunkCarry, ref_chunked_gated_delta

    out = []
    for carried, rows in ((0, 5), (30, 90)):
        w = _delta_weights(dtype, device, gen)
        conv = _rand((w.taps.shape[0], w.taps.shape[1] - 1), torch.float32, device, gen)
        state = _rand((w.value_heads, w.key_dim, w.value_dim), torch.float32, device, gen, 0.1)
        carry = ChunkCarry.start(conv, state, 128)
        if carried:
            mixed, _, b, a = _delta_rows(w, carried, dtype, device, gen)
            _, carry = ref_chunked_gated_delta(mixed, None, b, a, carry, w)
        out.append((*_delta_rows(w, rows, dtype, device, gen), carry, w))
    return out


def _carry_run(fn):
    """A chunked form's output with its carry's tensors (position checked by the caller)."""

    @functools.wraps(fn)
    def run(mixed, z, b, a, carry, w):
        out, after = fn(mixed, z, b, a, carry, w)
        return out, after.conv, after.state, after.k, after.v, after.beta, after.g

    return run


def _expert_cases(dtype, device, gen):
    """Tokens routed to k of E experts: one token, a batch whose experts repeat (tiles of
    several slots, one expert with more than a tile), and slots already in expert order (k = 1,
    the down projection's case); K not a multiple of BLOCK_K."""
    out = []
    for n, e, k, width, depth in [(1, 8, 2, 96, 64), (23, 4, 2, 64, 48), (37, 6, 1, 40, 128)]:
        experts = torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(n)])
        if n > 20:
            experts[: n // 2] = torch.tensor([1, 2][:k])  # > BLOCK_M slots of expert 1
        out.append(
            (
                _rand((n, depth), dtype, device, gen),
                _rand((e, width, depth), dtype, device, gen, depth**-0.5),
                experts.to(device),
            )
        )
    return out


def _route_cases(dtype, device, gen):
    """Router logits of 8, 60 and 256 experts (Qwen3.5-35B-A3B's count); k of 1, 2 and 8; a
    row of ties, which rank by expert id."""
    out = []
    for n, e, k, normalise in [(1, 8, 2, True), (19, 60, 4, False), (5, 256, 8, True)]:
        logits = _rand((n, e), dtype, device, gen, 3.0)
        out.append((logits, k, normalise))
    tied = torch.zeros((3, 16), dtype=dtype, device=device)
    tied[1, 5:9] = 1.0
    out.append((tied, 3, True))
    return out


def _combine_cases(dtype, device, gen):
    out = []
    for n, k, hidden in [(1, 2, 96), (23, 8, 1100), (4, 1, 64)]:
        weights = torch.softmax(torch.randn((n, k), generator=gen), dim=-1)
        out.append((_rand((n * k, hidden), dtype, device, gen), weights.to(device, dtype)))
    return out


def _expert_run(x, w, experts):
    """The kernel with its tile table made from the routing, as TritonOps.experts does."""
    tiles = expert_matmul.expert_tiles(experts.reshape(-1), w.shape[0])
    return expert_matmul.expert_matmul(x, w, tiles, experts.shape[1])


def _lanes_run(fn):
    """A lanes form with its pools copied first (it writes them in place), returning the
    outputs and both pools."""

    @functools.wraps(fn)
    def run(mixed, z, b, a, conv_pool, state_pool, slots, rows_per_lane, w, advance):
        conv_pool, state_pool = conv_pool.clone(), state_pool.clone()
        out = fn(mixed, z, b, a, conv_pool, state_pool, slots, rows_per_lane, w, advance)
        return out, conv_pool, state_pool

    return run


_LOW = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (2e-2, 2e-2), torch.float16: (5e-3, 5e-3)}

REGISTRY: list[KernelSpec] = [
    KernelSpec(
        "matmul",
        matmul.matmul,
        matmul.ref_matmul,
        (torch.float32, torch.bfloat16, torch.float16),
        True,
        "K a multiple of 64; x [M, K], w [N, K] unit stride on K; tile width and "
        "split-K fixed by (N, K), reduced in-kernel by the last arrival",
        _LOW,
        _matmul_cases,
    ),
    KernelSpec(
        "matmul_packed",
        matmul.matmul,
        matmul.ref_matmul,
        (torch.float32, torch.bfloat16, torch.float16),
        True,
        "a PackedWeight (MLX affine codes, 2/4/8 bits, K a multiple of the group; "
        "kernels/packed_matmul.py): codes read as bytes and dequantized in registers tile by "
        "tile (4-bit bf16/fp16 on a GPU: two at a time by packed arithmetic), the float "
        "matmul's plan rule and reduction shape",
        _LOW,
        _packed_cases,
    ),
    KernelSpec(
        "silu_mul",
        activation.silu_mul,
        activation.ref_silu_mul,
        (torch.float32, torch.bfloat16, torch.float16),
        True,
        "gate_up [M, 2I] contiguous; elementwise",
        _LOW,
        _silu_mul_cases,
    ),
    KernelSpec(
        "add_rms_norm",
        rmsnorm.add_rms_norm,
        rmsnorm.ref_add_rms_norm,
        (torch.float32, torch.bfloat16, torch.float16),
        True,
        "x [M, D] contiguous; one program per row",
        _LOW,
        _norm_cases,
    ),
    KernelSpec(
        "rope",
        rope.rope,
        rope.ref_rope,
        (torch.float32, torch.bfloat16, torch.float16),
        True,
        "x [T, H, D] contiguous, D even; cos/sin float32 [T, D/2]",
        _LOW,
        _rope_cases,
    ),
    KernelSpec(
        "rope_kv_write",
        _rope_kv_run,
        _rope_kv_ref,
        (torch.float32, torch.bfloat16, torch.float16),
        True,
        "q, k, v [T, H, D] with heads contiguous in a row (views of a fused qkv); D even; "
        "a program per token and up to 8 heads",
        _LOW,
        _rope_kv_cases,
    ),
    KernelSpec(
        "kv_write",
        _kv_run,
        _kv_ref,
        (torch.float32, torch.bfloat16, torch.float16),
        True,
        "k, v [T, H, D]; caches [S, H, D] contiguous; int64 slots",
        {t: (0.0, 0.0) for t in _LOW},
        _kv_cases,
    ),
    KernelSpec(
        "paged_attention",
        _attention_run,
        attention.ref_paged_attention,
        (torch.float32, torch.bfloat16, torch.float16),
        True,
        "head_dim a power of two >= 16; GQA; keys in 128-position absolute tiles",
        _LOW,
        _attention_cases,
    ),
    KernelSpec(
        "gated_delta",
        delta_rule.gated_delta,
        delta_rule.ref_gated_delta,
        (torch.float32, torch.bfloat16),
        True,
        "one lane's rows; dk, dv powers of two; one program per value head, rows in order",
        _LOW,
        _delta_cases,
    ),
    KernelSpec(
        "chunked_gated_delta",
        _carry_run(chunked_delta.chunked_gated_delta),
        _carry_run(chunked_delta.ref_chunked_gated_delta),
        (torch.float32, torch.bfloat16),
        True,
        "one lane's rows in 64-row chunks at absolute positions (the carry holds the current "
        "chunk's rows); dk, dv powers of two from 16",
        _LOW,
        _chunked_delta_cases,
    ),
    KernelSpec(
        "gated_delta_lanes",
        _lanes_run(delta_rule.gated_delta_lanes),
        _lanes_run(delta_rule.ref_gated_delta_lanes),
        (torch.float32, torch.bfloat16),
        True,
        "lanes of equal row counts, states in pool slots named on the device (CUDA graphs)",
        _LOW,
        _delta_lanes_cases,
    ),
    KernelSpec(
        "expert_matmul",
        _expert_run,
        expert_matmul.ref_expert_matmul,
        (torch.float32, torch.bfloat16, torch.float16),
        True,
        "x [n, K], w [E, N, K] unit stride on K; every (token, expert) slot in one launch, "
        "grouped on the device into 16-slot tiles of one expert; a grid fixed by (slots, E)",
        _LOW,
        _expert_cases,
    ),
    KernelSpec(
        "route_experts",
        moe_route.route_experts,
        moe_route.ref_route_experts,
        (torch.float32, torch.bfloat16),
        True,
        "router logits [n, E]: a program per token, fp32 softmax, the k best by k passes of a "
        "max (ties to the lower id), renormalised if asked; experts equal to the stable sort's",
        {torch.float32: (1e-6, 1e-7), torch.bfloat16: (1e-6, 1e-7)},
        _route_cases,
    ),
    KernelSpec(
        "combine_experts",
        moe_route.combine_experts,
        moe_route.ref_combine_experts,
        (torch.float32, torch.bfloat16),
        True,
        "outputs [n * k, hidden] contiguous, weights [n, k]; each token's weighted sum in its "
        "rank order, every product and sum rounded as torch's elementwise ops: the same bits "
        "(float32 checked bitwise; bf16 to a tolerance, because Triton's CPU interpreter does "
        "not round float32 to bf16 to nearest as the GPU and torch do)",
        {torch.float32: (0.0, 0.0), torch.bfloat16: (5e-2, 1e-1)},
        _combine_cases,
    ),
    KernelSpec(
        "greedy_tokens",
        sampling.greedy_tokens,
        sampling.ref_greedy_tokens,
        (torch.float32,),
        True,
        "logits [R, V] contiguous; one pass per row; argmax ties to the lowest id",
        {torch.float32: (1e-5, 1e-5)},
        _greedy_cases,
    ),
    KernelSpec(
        "sample_tokens",
        sampling.sample_tokens,
        sampling.ref_sample_tokens,
        (torch.float32,),
        True,
        "logits [R, V] contiguous; top-k/top-p without a sort (present-value searches, a walk "
        "up the sorted order); tokens equal to the sorting reference, ties included, their "
        "logprobs within 1e-5",
        {torch.float32: (1e-5, 1e-5)},
        _sampling_cases,
    ),
]


def by_name(name: str) -> KernelSpec:
    return next(s for s in REGISTRY if s.name == name)
