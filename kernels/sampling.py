"""Position-keyed sampling over the vocabulary: greedy argmax, or argmax(logits / T + gumbel)
over the top-k / top-p set, one program per row. The Gumbel noise is the same counter-based hash
of (seed, position, token) as lanes.sampling, so a row's token never depends on the batch.

A greedy row takes one pass over the vocabulary (argmax and an online log-sum-exp); a sampled row
takes several. Top-k and top-p are thresholds found by bisection (no sort): top-k keeps z >= the largest value
v with #(z >= v) >= k; top-p keeps p >= the largest tau with mass(p >= tau) >= top_p, i.e. the
smallest most-likely set reaching top_p, as the sorting reference does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lanes.kernels.common import check

_BISECT = 40  # float32 thresholds: 40 halvings reach the resolution of the interval's floats
BLOCK_V = 8192  # with 16 warps: a 128K-vocabulary row in 16 steps (one program per row)


@triton.jit
def _mix32(x):
    x = x ^ (x >> 16)
    x = x * 0x85EBCA6B
    x = x ^ (x >> 13)
    x = x * 0xC2B2AE35
    return x ^ (x >> 16)


@triton.jit
def _gumbel(seed_lo, seed_hi, pos, tok):
    # the same mixing as lanes.sampling.uniform_noise, stream 0, in uint32 arithmetic
    h = _mix32(tl.zeros_like(tok) + (seed_lo ^ 0x9E3779B9))
    h = _mix32(h ^ seed_hi)
    h = _mix32(h ^ pos)
    h = _mix32(h ^ tok)
    u = ((h >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)
    return -tl.log(-tl.log(u))


@triton.jit
def _greedy_row(base, V, cols, BLOCK: tl.constexpr):
    """One pass over a row: the argmax (ties to the lowest id) and its log-softmax, by an online
    log-sum-exp. Returns (token, logprob)."""
    m = float("-inf")
    total = 0.0
    best_i = 0
    for start in range(0, V, BLOCK):
        idx = start + cols
        z = tl.load(base + idx, mask=idx < V, other=float("-inf")).to(tl.float32)
        block_max = tl.max(z, axis=0)
        block_i = tl.min(tl.where(z == block_max, idx, V), axis=0)
        new_m = tl.maximum(m, block_max)
        total = total * tl.exp(m - new_m) + tl.sum(tl.exp(z - new_m), axis=0)
        best_i = tl.where(block_max > m, block_i, best_i)
        m = new_m
    return best_i, -tl.log(total)


@triton.jit
def _sample_kernel(
    logits_ptr,  # [R, V]
    temp_ptr,  # [R] fp32 (0: greedy)
    top_k_ptr,  # [R] int64 (0: off)
    top_p_ptr,  # [R] fp32 (1: off)
    seed_lo_ptr,  # [R] int64 holding a uint32
    seed_hi_ptr,  # [R] int64 holding a uint32
    pos_ptr,  # [R] int64 holding a uint32
    out_ptr,  # [R] int64
    logprob_ptr,  # [R] fp32: log-probability of the chosen token under the sampled distribution
    V,
    BLOCK: tl.constexpr,
    BISECT: tl.constexpr,
):
    row = tl.program_id(0)
    base = logits_ptr + row.to(tl.int64) * V
    temp = tl.load(temp_ptr + row)
    top_k = tl.load(top_k_ptr + row)
    top_p = tl.load(top_p_ptr + row)
    greedy = temp == 0.0
    cols = tl.arange(0, BLOCK)
    if greedy:
        token, logprob = _greedy_row(base, V, cols, BLOCK)
        tl.store(out_ptr + row, token.to(tl.int64))
        tl.store(logprob_ptr + row, logprob)
    else:
        inv_t = 1.0 / temp

        # max and min of z = logits / T
        z_max = float("-inf")
        z_min = float("inf")
        for start in range(0, V, BLOCK):
            mask = start + cols < V
            z = tl.load(base + start + cols, mask=mask, other=0.0).to(tl.float32) * inv_t
            z_max = tl.maximum(z_max, tl.max(tl.where(mask, z, float("-inf")), axis=0))
            z_min = tl.minimum(z_min, tl.min(tl.where(mask, z, float("inf")), axis=0))

        # top-k: the largest threshold keeping at least top_k values
        k_thr = z_min
        if (top_k > 0) & (top_k < V):
            lo = z_min
            hi = z_max
            for _ in range(BISECT):
                mid = lo + (hi - lo) * 0.5
                count = 0
                for start in range(0, V, BLOCK):
                    mask = start + cols < V
                    z = tl.load(base + start + cols, mask=mask, other=0.0).to(tl.float32) * inv_t
                    count += tl.sum(tl.where(mask & (z >= mid), 1, 0), axis=0)
                keep_mid = count >= top_k
                lo = tl.where(keep_mid, mid, lo)
                hi = tl.where(keep_mid, hi, mid)
            k_thr = lo

        # softmax normaliser over the top-k set, then the top-p threshold on probabilities
        total = 0.0
        for start in range(0, V, BLOCK):
            mask = start + cols < V
            z = tl.load(base + start + cols, mask=mask, other=0.0).to(tl.float32) * inv_t
            total += tl.sum(tl.where(mask & (z >= k_thr), tl.exp(z - z_max), 0.0), axis=0)
        p_thr = 0.0
        if top_p < 1.0:
            lo = 0.0
            hi = 1.0
            for _ in range(BISECT):
                mid = lo + (hi - lo) * 0.5
                mass = 0.0
                for start in range(0, V, BLOCK):
                    mask = start + cols < V
                    z = tl.load(base + start + cols, mask=mask, other=0.0).to(tl.float32) * inv_t
                    p = tl.exp(z - z_max) / total
                    mass += tl.sum(tl.where(mask & (z >= k_thr) & (p >= mid), p, 0.0), axis=0)
                keep_mid = mass >= top_p
                lo = tl.where(keep_mid, mid, lo)
                hi = tl.where(keep_mid, hi, mid)
            p_thr = lo

        # argmax of z (+ noise) over the kept set; ties go to the lowest token id
        seed_lo = tl.load(seed_lo_ptr + row).to(tl.uint32)
        seed_hi = tl.load(seed_hi_ptr + row).to(tl.uint32)
        pos = tl.load(pos_ptr + row).to(tl.uint32)
        best = float("-inf")
        best_i = 0
        best_z = 0.0
        kept_total = 0.0  # the normaliser of the distribution sampled from (top-k and top-p set)
        for start in range(0, V, BLOCK):
            idx = start + cols
            mask = idx < V
            z = tl.load(base + idx, mask=mask, other=0.0).to(tl.float32) * inv_t
            keep = mask & (z >= k_thr) & (tl.exp(z - z_max) / total >= p_thr)
            kept_total += tl.sum(tl.where(keep, tl.exp(z - z_max), 0.0), axis=0)
            score = z + _gumbel(seed_lo, seed_hi, pos, idx.to(tl.uint32))
            score = tl.where(keep, score, float("-inf"))
            m = tl.max(score, axis=0)
            i = tl.min(tl.where(score == m, idx, V), axis=0)
            zi = tl.sum(tl.where(idx == i, z, 0.0), axis=0)
            take = m > best
            best_i = tl.where(take, i, best_i)
            best_z = tl.where(take, zi, best_z)
            best = tl.where(take, m, best)
        tl.store(out_ptr + row, best_i.to(tl.int64))
        tl.store(logprob_ptr + row, best_z - z_max - tl.log(kept_total))


@triton.jit
def _greedy_kernel(
    logits_ptr,  # [R, V]
    out_ptr,  # [R] int64
    logprob_ptr,  # [R] fp32: log-softmax of the chosen token
    V,
    BLOCK: tl.constexpr,
):
    # _sample_kernel's greedy rows, with no per-row parameters to copy to the device
    row = tl.program_id(0)
    base = logits_ptr + row.to(tl.int64) * V
    token, logprob = _greedy_row(base, V, tl.arange(0, BLOCK), BLOCK)
    tl.store(out_ptr + row, token.to(tl.int64))
    tl.store(logprob_ptr + row, logprob)


def greedy_tokens(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The argmax of each row of logits [R, V] (ties to the lowest id) and its log-softmax:
    (tokens int64 [R], logprobs fp32 [R]). One launch, nothing copied to the device."""
    check(logits.dim() == 2 and logits.is_contiguous(), "logits must be contiguous [R, V]")
    r, v = logits.shape
    tokens = torch.empty(r, dtype=torch.int64, device=logits.device)
    logprobs = torch.empty(r, dtype=torch.float32, device=logits.device)
    if r:
        _greedy_kernel[(r,)](logits, tokens, logprobs, v, BLOCK=BLOCK_V, num_warps=16)
    return tokens, logprobs


def ref_greedy_tokens(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    tokens = torch.argmax(logprobs, dim=-1)
    return tokens, logprobs.gather(-1, tokens[:, None])[:, 0]


def sample_tokens(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    seeds: list[int],
    positions: list[int],
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row of logits [R, V] -> (tokens int64 [R], logprobs fp32 [R]): each token's
    log-probability under the distribution it was sampled from (after temperature, top-k, top-p;
    greedy rows: the plain log-softmax). Row parameters travel to the device in two copies."""
    check(logits.dim() == 2 and logits.is_contiguous(), "logits must be contiguous [R, V]")
    r, v = logits.shape
    check(
        temperature.shape == top_k.shape == top_p.shape == (r,),
        "one temperature, top_k, top_p per row",
    )
    check(len(seeds) == len(positions) == r, "one seed and position per row")
    dev = logits.device
    mask = 0xFFFFFFFF
    ints = torch.tensor(  # [4, R]: seed low and high words, position, top_k
        [
            [s & mask for s in seeds],
            [(s >> 32) & mask for s in seeds],
            [p & mask for p in positions],
            [int(k) for k in top_k.tolist()],
        ],
        dtype=torch.int64,
    ).to(dev, non_blocking=True)
    floats = torch.stack([temperature.float().cpu(), top_p.float().cpu()]).to(dev)  # [2, R]
    tokens = torch.empty(r, dtype=torch.int64, device=dev)
    logprobs = torch.empty(r, dtype=torch.float32, device=dev)
    if r:
        _sample_kernel[(r,)](
            logits,
            floats[0],
            ints[3],
            floats[1],
            ints[0],
            ints[1],
            ints[2],
            tokens,
            logprobs,
            v,
            BLOCK=BLOCK_V,
            BISECT=_BISECT,
            num_warps=16,
        )
    return tokens, logprobs


def ref_sample_tokens(logits, temperature, top_k, top_p, seeds, positions):
    """The sorting reference: lanes.sampling.sample_row for each row, and the log-probability of
    its token."""
    from lanes.sampling import SamplingParams, sample_row

    tokens, logprobs = [], []
    for i in range(logits.shape[0]):
        p = SamplingParams(
            temperature=float(temperature[i]),
            top_k=int(top_k[i]),
            top_p=float(top_p[i]),
            seed=seeds[i],
        )
        token, row_logprobs = sample_row(logits[i], p, positions[i], seeds[i])
        tokens.append(token)
        logprobs.append(float(row_logprobs[token]))
    dev = logits.device
    return (
        torch.tensor(tokens, dtype=torch.int64, device=dev),
        torch.tensor(logprobs, dtype=torch.float32, device=dev),
    )
