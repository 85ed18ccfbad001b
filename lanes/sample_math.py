"""Position-keyed sampling as math on tensors and plain numbers: the counter-based noise of
(seed, position, stream, token), and a row's token under temperature, top-k and top-p.

`lanes.sampling` applies it to a request's SamplingParams; the kernels' references
(kernels/sampling.py) check the device sampler against it. A token never depends on batch
composition, lane order or any RNG state.
"""

from __future__ import annotations

import torch

_MASK32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit avalanche mix (murmur3's finaliser) on int64 tensors holding values < 2**32.

    Products may wrap int64; only their low 32 bits are kept, which wrapping does not change.
    """
    x = x ^ (x >> 16)
    x = (x * 0x85EBCA6B) & _MASK32
    x = x ^ (x >> 13)
    x = (x * 0xC2B2AE35) & _MASK32
    return x ^ (x >> 16)


# Independent noise streams for one (seed, position): the token draw, and the two extra draws of
# rejection-mode verification (accept test, residual sample).
STREAM_TOKEN, STREAM_ACCEPT, STREAM_RESIDUAL = 0, 1, 2


def noise_hash(
    seed: int, position: int, n: int, stream: int = STREAM_TOKEN, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """The 32-bit hash [n] (int64 holding a uint32) of (seed, position, stream, token) that all
    of this module's noise is made from."""
    index = torch.arange(n, dtype=torch.int64, device=device)
    h = _mix32(torch.full_like(index, (seed & _MASK32) ^ 0x9E3779B9))
    h = _mix32(h ^ ((seed >> 32) & _MASK32))
    h = _mix32(h ^ (position & _MASK32) ^ (stream << 28))
    return _mix32(h ^ index)


def uniform_noise(
    seed: int, position: int, n: int, stream: int = STREAM_TOKEN, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Uniform noise [n] (float32) strictly inside (0, 1) for one (seed, position, stream): a pure
    function. The 23 high bits of the hash, + 0.5: every value and 1 - 2**-24, the largest, are
    exact in float32 (24 bits + 0.5 would round the largest to 1.0, whose Gumbel noise is inf)."""
    h = noise_hash(seed, position, n, stream, device)
    return ((h >> 9).to(torch.float32) + 0.5) * (1.0 / 2**23)


def _mix32_int(x: int) -> int:
    x ^= x >> 16
    x = (x * 0x85EBCA6B) & _MASK32
    x ^= x >> 13
    x = (x * 0xC2B2AE35) & _MASK32
    return x ^ (x >> 16)


def uniform_at(seed: int, position: int, stream: int = STREAM_TOKEN, index: int = 0) -> float:
    """uniform_noise(seed, position, n, stream)[index] in plain Python: one draw without a
    tensor (or a device round trip) for the host's per-draft decisions; the same bits."""
    h = _mix32_int((seed & _MASK32) ^ 0x9E3779B9)
    h = _mix32_int(h ^ ((seed >> 32) & _MASK32))
    h = _mix32_int(h ^ (position & _MASK32) ^ (stream << 28))
    h = _mix32_int(h ^ index)
    return ((h >> 9) + 0.5) * (1.0 / 2**23)  # exact in float32 and in float64 alike


def gumbel_noise(
    seed: int, position: int, vocab_size: int, device: torch.device | str = "cpu", stream: int = 0
) -> torch.Tensor:
    """Gumbel(0, 1) noise [vocab_size] (float32) for one (seed, position, stream)."""
    return -torch.log(-torch.log(uniform_noise(seed, position, vocab_size, stream, device)))


def row_logprobs(
    logits: torch.Tensor, temperature: float, top_k: int, top_p: float
) -> torch.Tensor:
    """Log-probabilities [vocab] of the distribution a row is sampled from: temperature, then
    top-k and top-p (-inf outside). Temperature 0 (greedy) gives the plain log-softmax."""
    logits = logits.float()
    if temperature == 0.0:
        return torch.log_softmax(logits, dim=-1)
    scaled = logits / temperature
    keep = _top_k_top_p_mask(scaled, top_k, top_p)
    return torch.log_softmax(scaled.masked_fill(~keep, float("-inf")), dim=-1)


def sample_token(
    logits: torch.Tensor, temperature: float, top_k: int, top_p: float, seed: int, position: int
) -> tuple[int, torch.Tensor]:
    """One token from one row of logits [vocab]; returns (token, log-probabilities [vocab]).
    One row at a time, so every reduction has the same shape whatever the batch is."""
    logprobs = row_logprobs(logits, temperature, top_k, top_p)
    if temperature == 0.0:
        return int(torch.argmax(logprobs)), logprobs
    noise = gumbel_noise(seed, position, logits.shape[-1], logits.device)
    return int(torch.argmax(logprobs + noise)), logprobs


def _top_k_top_p_mask(scaled: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Boolean mask [vocab] of the tokens kept by top-k, then top-p (nucleus)."""
    keep = torch.ones_like(scaled, dtype=torch.bool)
    if 0 < top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, top_k).values[-1]
        keep &= scaled >= kth
    if top_p < 1.0:
        probs = torch.softmax(scaled.masked_fill(~keep, float("-inf")), dim=-1)
        sorted_probs, order = torch.sort(probs, descending=True, stable=True)
        # Keep each token whose preceding mass is below top_p: the smallest set reaching top_p.
        before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        nucleus = torch.zeros_like(keep)
        nucleus[order] = before < top_p
        keep &= nucleus
    return keep
