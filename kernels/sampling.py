"""Position-keyed sampling over the vocabulary: greedy argmax, or argmax(logits / T + gumbel)
over the top-k / top-p set, one program per row. The Gumbel noise is the same counter-based hash
of (seed, position, token) as lanes.sampling, so a row's token never depends on the batch.

Sets are those of the sorting reference (lanes.sampling): top-k keeps z >= the k-th largest z
(ties kept); top-p then keeps token u iff the mass of the tokens sorted before it (z descending,
ties by id) is below top_p. No sort: a greedy row takes one pass over the vocabulary (argmax and
an online log-sum-exp), and so does a sampled row without top-k or top-p (the noisy argmax rides
along). The rest are passes that each learn something exact:
  - top-k: a bisection over z whose ends are z values present in the row, stopped as soon as the
    k-th largest value is pinned (usually a handful of passes, not 40 halvings);
  - top-p, the token: the noisy argmax t over a candidate set, then one pass that sums the mass
    sorted before t (t is in the nucleus iff that is below top_p) and, in the same pass, finds the
    noisy argmax over the tokens sorted before t, the next candidate if t is out. The argmax
    over a set that holds the nucleus is the nucleus' argmax as soon as it lies inside it;
  - top-p, the log-probability's normaliser: the nucleus' last value by the same present-value
    bisection (on mass), then one pass that keeps that value's ties in id order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lanes.kernels.common import check
from lanes.kernels.triton_shim import tl, triton

MAX_SEARCH = 64  # passes of a bisection; each pass pins a present value, so it ends far sooner
BLOCK_V = 4096  # with 16 warps, 8 values per thread per step

# Every pass keeps its running state per slot of the block (elementwise across blocks) and
# reduces across the block's threads once at its end: cross-warp reductions need barriers, and
# one per block step cost more than the arithmetic. The order of every sum is fixed by the
# vocabulary size alone.


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
    u = ((h >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)  # strictly inside (0, 1)
    return -tl.log(-tl.log(u))


@triton.jit
def _fold_max(score, idx, z, best, best_i, best_z):
    """Per slot: keep the larger score (the earlier block, so the lower id, on ties)."""
    take = score > best
    return tl.where(take, score, best), tl.where(take, idx, best_i), tl.where(take, z, best_z)


@triton.jit
def _argmax_of(best, best_i, best_z, V):
    """The slots' argmax: (token with the largest score, lowest id on ties; its z)."""
    m = tl.max(best, axis=0)
    i = tl.min(tl.where(best == m, best_i, V), axis=0)
    return i, tl.max(tl.where(best_i == i, best_z, float("-inf")), axis=0)


@triton.jit
def _fold_softmax(zm, m, s):
    """Per slot: an online max and sum of exp(z - max); -inf values add nothing (and no
    -inf - -inf is ever formed)."""
    new_m = tl.maximum(m, zm)
    finite_m = tl.where(new_m == float("-inf"), 0.0, new_m)
    return new_m, s * tl.exp(m - finite_m) + tl.exp(zm - finite_m)


@triton.jit
def _greedy_row(base, V, cols, BLOCK: tl.constexpr):
    """One pass over a row: the argmax (ties to the lowest id) and its log-softmax, by an online
    log-sum-exp. Returns (token, logprob)."""
    m = tl.full([BLOCK], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK], tl.float32)
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    best_i = tl.full([BLOCK], V, tl.int32)
    for start in range(0, V, BLOCK):
        idx = start + cols
        z = tl.load(base + idx, mask=idx < V, other=float("-inf")).to(tl.float32)
        m, s = _fold_softmax(z, m, s)
        best, best_i, _ = _fold_max(z, idx, z, best, best_i, z)
    z_max = tl.max(m, axis=0)
    total = tl.sum(s * tl.exp(m - z_max), axis=0)
    token, z_tok = _argmax_of(best, best_i, best, V)
    return token, z_tok - z_max - tl.log(total)


@triton.jit
def _z_block(base, start, cols, V, inv_t):
    """Token ids, in-row mask and z = logits / T of one block."""
    idx = start + cols
    inside = idx < V
    z = tl.load(base + idx, mask=inside, other=0.0).to(tl.float32) * inv_t
    return idx, inside, z


@triton.jit
def _split(base, V, inv_t, z_max, k_thr, mid, cols, USE_MASS: tl.constexpr, BLOCK: tl.constexpr):
    """One pass over the top-k set (z >= k_thr) around a threshold `mid`: the weight of z >= mid,
    the smallest present z >= mid with its weight, and the largest present z < mid with its
    weight. Weight: the count of tokens, or their mass exp(z - z_max) (USE_MASS)."""
    w_ge = tl.zeros([BLOCK], tl.float32)
    z_up = tl.full([BLOCK], float("inf"), tl.float32)
    w_up = tl.zeros([BLOCK], tl.float32)
    z_dn = tl.full([BLOCK], float("-inf"), tl.float32)
    w_dn = tl.zeros([BLOCK], tl.float32)
    for start in range(0, V, BLOCK):
        idx, inside, z = _z_block(base, start, cols, V, inv_t)
        live = inside & (z >= k_thr)
        if USE_MASS:  # noqa: SIM108 (a compile-time branch)
            w = tl.where(live, tl.exp(z - z_max), 0.0)
        else:
            w = tl.where(live, 1.0, 0.0)
        up = live & (z >= mid)
        w_ge += tl.where(up, w, 0.0)
        zu = tl.where(up, z, float("inf"))
        wu = tl.where(up, w, 0.0)
        w_up = tl.where(zu < z_up, wu, tl.where(zu == z_up, w_up + wu, w_up))
        z_up = tl.minimum(z_up, zu)
        dn = live & (z < mid)
        zd = tl.where(dn, z, float("-inf"))
        wd = tl.where(dn, w, 0.0)
        w_dn = tl.where(zd > z_dn, wd, tl.where(zd == z_dn, w_dn + wd, w_dn))
        z_dn = tl.maximum(z_dn, zd)
    up_min = tl.min(z_up, axis=0)
    dn_max = tl.max(z_dn, axis=0)
    return (
        tl.sum(w_ge, axis=0),
        up_min,
        tl.sum(tl.where(z_up == up_min, w_up, 0.0), axis=0),
        dn_max,
        tl.sum(tl.where(z_dn == dn_max, w_dn, 0.0), axis=0),
    )


@triton.jit
def _set_pass(
    base, V, inv_t, z_max, k_thr, tok, tok_z, seed_lo, seed_hi, pos, cols,
    AHEAD: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """One pass over the set z >= k_thr (with AHEAD: only the tokens sorted before `tok`, whose
    z is tok_z: larger z, or equal z and a lower id): (its mass exp(z - z_max), its noisy
    argmax, that token's z)."""
    mass = tl.zeros([BLOCK], tl.float32)
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    best_i = tl.full([BLOCK], V, tl.int32)
    best_z = tl.zeros([BLOCK], tl.float32)
    for start in range(0, V, BLOCK):
        idx, inside, z = _z_block(base, start, cols, V, inv_t)
        member = inside & (z >= k_thr)
        if AHEAD:
            member = member & ((z > tok_z) | ((z == tok_z) & (idx < tok)))
        mass += tl.where(member, tl.exp(z - z_max), 0.0)
        noise = _gumbel(seed_lo, seed_hi, pos, idx.to(tl.uint32))
        score = tl.where(member, z + noise, float("-inf"))
        best, best_i, best_z = _fold_max(score, idx, z, best, best_i, best_z)
    token, token_z = _argmax_of(best, best_i, best_z, V)
    return tl.sum(mass, axis=0), token, token_z


@triton.jit
def _kth_value(
    base, V, inv_t, z_min, z_max, top_k, cols, SEARCH: tl.constexpr, BLOCK: tl.constexpr
):
    """The k-th largest z of the row (the top-k threshold; ties kept): the largest present value
    c with #(z >= c) >= k. lo is always such a value, hi never is."""
    k = top_k.to(tl.float32)
    lo = z_min
    hi = z_max + 1.0
    found = lo
    done = 0
    steps = 0
    while (done == 0) & (steps < SEARCH):
        mid = lo + (hi - lo) * 0.5
        mid = tl.where(mid <= lo, hi, mid)
        n_ge, z_up, n_up, z_dn, n_dn = _split(
            base, V, inv_t, z_max, float("-inf"), mid, cols, False, BLOCK
        )
        if n_ge >= k:  # z_up qualifies; so does nothing above it when n_ge - n_up < k
            lo = z_up
            found = z_up
            done = (n_ge - n_up < k).to(tl.int32)
        else:  # nothing >= mid qualifies; z_dn does when its ties bring the count to k
            hi = z_dn
            pinned = n_ge + n_dn >= k
            found = tl.where(pinned, z_dn, found)
            done = pinned.to(tl.int32)
        steps += 1
    return found


@triton.jit
def _nucleus_value(
    base, V, inv_t, z_max, k_thr, inside_mass, z_in, z_floor, cols,
    SEARCH: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """The nucleus' last value: the smallest present z whose strictly larger values hold less
    mass than inside_mass (= top_p x the top-k set's mass); z_in is a value known to be inside,
    z_floor one below every value. Returns (that value, the mass of the values above it)."""
    lo = z_floor  # below every value: outside
    hi = z_in
    found = z_in
    above = 0.0
    done = 0
    steps = 0
    while (done == 0) & (steps < SEARCH):
        mid = lo + (hi - lo) * 0.5
        mid = tl.where(mid <= lo, hi, mid)
        m_ge, z_up, m_up, z_dn, m_dn = _split(base, V, inv_t, z_max, k_thr, mid, cols, True, BLOCK)
        if m_ge < inside_mass:  # z_dn (all values >= mid above it) is inside: search below
            hi = z_dn
            found = z_dn
            above = m_ge
            done = (z_dn == float("-inf")).to(tl.int32)
        elif m_ge - m_up < inside_mass:  # z_dn is out and z_up is in: z_up is the last value
            found = z_up
            above = m_ge - m_up
            done = 1
        else:
            lo = z_up
        steps += 1
    return found, above


@triton.jit
def _sample_kernel(
    logits_ptr,  # [R, V]
    temp_ptr,  # [P] fp32 (0: greedy)
    top_k_ptr,  # [P] int64 (0: off)
    top_p_ptr,  # [P] fp32 (1: off)
    seed_lo_ptr,  # [P] int64 holding a uint32
    seed_hi_ptr,  # [P] int64 holding a uint32
    pos_ptr,  # [R] int64: the position each row's token will stand at
    out_ptr,  # [R] int64
    logprob_ptr,  # [R] fp32: log-probability of the chosen token under the sampled distribution
    V,
    rows_per_param,  # rows row // rows_per_param share parameters (a lane's verify rows)
    BLOCK: tl.constexpr,
    SEARCH: tl.constexpr,
):
    row = tl.program_id(0)
    base = logits_ptr + row.to(tl.int64) * V
    lane = row // rows_per_param
    temp = tl.load(temp_ptr + lane)
    top_k = tl.load(top_k_ptr + lane)
    top_p = tl.load(top_p_ptr + lane)
    cols = tl.arange(0, BLOCK)
    if temp == 0.0:
        token, logprob = _greedy_row(base, V, cols, BLOCK)
        tl.store(out_ptr + row, token.to(tl.int64))
        tl.store(logprob_ptr + row, logprob)
    else:
        inv_t = 1.0 / temp
        seed_lo = tl.load(seed_lo_ptr + lane).to(tl.uint32)
        seed_hi = tl.load(seed_hi_ptr + lane).to(tl.uint32)
        pos = tl.load(pos_ptr + row).to(tl.uint32)

        # one pass: max, min and (online) softmax normaliser of z, and the noisy argmax of all
        m = tl.full([BLOCK], float("-inf"), tl.float32)
        s = tl.zeros([BLOCK], tl.float32)
        low = tl.full([BLOCK], float("inf"), tl.float32)
        best = tl.full([BLOCK], float("-inf"), tl.float32)
        best_i = tl.full([BLOCK], V, tl.int32)
        best_z = tl.zeros([BLOCK], tl.float32)
        for start in range(0, V, BLOCK):
            idx, inside, z = _z_block(base, start, cols, V, inv_t)
            zm = tl.where(inside, z, float("-inf"))
            m, s = _fold_softmax(zm, m, s)
            # a drafter over part of the vocabulary leaves -inf: not the row's smallest value
            low = tl.minimum(low, tl.where(zm > float("-inf"), zm, float("inf")))
            noise = _gumbel(seed_lo, seed_hi, pos, idx.to(tl.uint32))
            best, best_i, best_z = _fold_max(zm + noise, idx, z, best, best_i, best_z)
        z_max = tl.max(m, axis=0)
        total = tl.sum(s * tl.exp(m - z_max), axis=0)
        z_min = tl.min(low, axis=0)
        tok, tok_z = _argmax_of(best, best_i, best_z, V)

        # top-k: the set z >= k_thr, its mass and its noisy argmax
        k_thr = float("-inf")
        if (top_k > 0) & (top_k < V):
            k_thr = _kth_value(base, V, inv_t, z_min, z_max, top_k, cols, SEARCH, BLOCK)
            total, tok, tok_z = _set_pass(
                base, V, inv_t, z_max, k_thr, tok, tok_z, seed_lo, seed_hi, pos, cols, False, BLOCK
            )

        norm = total
        if top_p < 1.0:
            inside_mass = top_p * total
            # walk up the sorted order until the candidate is in the nucleus
            walking = 1
            while walking != 0:
                before, nxt, nxt_z = _set_pass(
                    base, V, inv_t, z_max, k_thr, tok, tok_z, seed_lo, seed_hi, pos, cols, True,
                    BLOCK,
                )  # fmt: skip
                out = before >= inside_mass
                tok = tl.where(out, nxt, tok)
                tok_z = tl.where(out, nxt_z, tok_z)
                walking = out.to(tl.int32)
            # the normaliser: the values above the nucleus' last one, and its ties in id order
            floor = tl.maximum(z_min, k_thr) - 1.0
            z_last, above = _nucleus_value(
                base, V, inv_t, z_max, k_thr, inside_mass, tok_z, floor, cols, SEARCH, BLOCK
            )
            norm = above
            ties_before = 0.0
            for start in range(0, V, BLOCK):
                idx, inside, z = _z_block(base, start, cols, V, inv_t)
                tie = inside & (z == z_last)
                e = tl.where(tie, tl.exp(z - z_max), 0.0)
                first_mass = above + ties_before + tl.cumsum(e, axis=0) - e
                norm += tl.sum(tl.where(tie & (first_mass < inside_mass), e, 0.0), axis=0)
                ties_before += tl.sum(e, axis=0)
        tl.store(out_ptr + row, tok.to(tl.int64))
        tl.store(logprob_ptr + row, tok_z - z_max - tl.log(norm))


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


@dataclass(frozen=True)
class RowParams:
    """Sampling parameters of P rows (or lanes) on the device, as the kernel reads them."""

    temperature: torch.Tensor  # [P] fp32 (0: greedy)
    top_k: torch.Tensor  # [P] int64 (0: off)
    top_p: torch.Tensor  # [P] fp32 (1: off)
    seed_lo: torch.Tensor  # [P] int64: the seed's low 32 bits
    seed_hi: torch.Tensor  # [P] int64: its high 32 bits

    @classmethod
    def upload(cls, temperature, top_k, top_p, seeds, device) -> RowParams:
        """From host sequences, in two asynchronous copies (pinned where the device is CUDA):
        nothing waits for work already queued on the device."""
        device = torch.device(device)
        pin = device.type == "cuda"
        mask = 0xFFFFFFFF
        ints = torch.tensor(  # [3, P]: top_k, seed low and high words
            [[int(k) for k in top_k], [s & mask for s in seeds], [(s >> 32) & mask for s in seeds]],
            dtype=torch.int64,
            pin_memory=pin,
        ).to(device, non_blocking=True)
        floats = torch.tensor(
            [[float(t) for t in temperature], [float(p) for p in top_p]],
            dtype=torch.float32,
            pin_memory=pin,
        ).to(device, non_blocking=True)
        return cls(floats[0], ints[0], floats[1], ints[1], ints[2])

    def copy_(self, other: RowParams) -> None:
        """Take other's values into these tensors (buffers a captured graph reads)."""
        for name in ("temperature", "top_k", "top_p", "seed_lo", "seed_hi"):
            getattr(self, name).copy_(getattr(other, name), non_blocking=True)

    @classmethod
    def zeros(cls, n: int, device) -> RowParams:
        """n greedy rows."""
        f32, i64 = dict(dtype=torch.float32, device=device), dict(dtype=torch.int64, device=device)
        return cls(
            torch.zeros(n, **f32), torch.zeros(n, **i64), torch.ones(n, **f32),
            torch.zeros(n, **i64), torch.zeros(n, **i64),
        )  # fmt: skip


def sample_with(
    logits: torch.Tensor,
    params: RowParams,
    positions: torch.Tensor,
    rows_per_param: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row of logits [R, V], row r sampled with params[r // rows_per_param] at
    positions[r] (int64 [R], on the device) -> (tokens int64 [R], logprobs fp32 [R]). Reads and
    writes device tensors only: a CUDA graph can capture it."""
    check(logits.dim() == 2 and logits.is_contiguous(), "logits must be contiguous [R, V]")
    r, v = logits.shape
    check(positions.shape == (r,) and positions.dtype == torch.int64, "int64 positions [R]")
    check(params.temperature.shape[0] * rows_per_param >= r, "parameters for every row")
    tokens = torch.empty(r, dtype=torch.int64, device=logits.device)
    logprobs = torch.empty(r, dtype=torch.float32, device=logits.device)
    if r:
        _sample_kernel[(r,)](
            logits,
            params.temperature,
            params.top_k,
            params.top_p,
            params.seed_lo,
            params.seed_hi,
            positions,
            tokens,
            logprobs,
            v,
            rows_per_param,
            BLOCK=BLOCK_V,
            SEARCH=MAX_SEARCH,
            num_warps=16,
        )
    return tokens, logprobs


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
    greedy rows: the plain log-softmax). Row parameters (host tensors or lists) travel to the
    device asynchronously: nothing here waits for work already queued."""
    r = logits.shape[0]
    check(
        temperature.shape == top_k.shape == top_p.shape == (r,),
        "one temperature, top_k, top_p per row",
    )
    check(len(seeds) == len(positions) == r, "one seed and position per row")
    dev = logits.device
    params = RowParams.upload(temperature.tolist(), top_k.tolist(), top_p.tolist(), seeds, dev)
    where = torch.tensor(positions, dtype=torch.int64, pin_memory=dev.type == "cuda")
    return sample_with(logits, params, where.to(dev, non_blocking=True))


def ref_sample_tokens(logits, temperature, top_k, top_p, seeds, positions):
    """The sorting reference: lanes.sample_math.sample_token for each row, and the
    log-probability of its token."""
    from lanes.sample_math import sample_token

    tokens, logprobs = [], []
    for i in range(logits.shape[0]):
        t, k, p = float(temperature[i]), int(top_k[i]), float(top_p[i])
        token, row_logprobs = sample_token(logits[i], t, k, p, seeds[i], positions[i])
        tokens.append(token)
        logprobs.append(float(row_logprobs[token]))
    dev = logits.device
    return (
        torch.tensor(tokens, dtype=torch.int64, device=dev),
        torch.tensor(logprobs, dtype=torch.float32, device=dev),
    )
