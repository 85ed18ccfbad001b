"""Sampling parameters and position-keyed sampling.

A sampled token is `argmax(logits / T + gumbel(seed, position, token))` over the top-k / top-p set.
The Gumbel noise is a pure function of (request seed, absolute position, token id) computed by a
counter-based hash, so a token never depends on batch composition, lane order or any RNG state; a
drafter that uses the same noise proposes the target's token whenever their distributions agree.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

import torch

from lanes.grammar import Grammar

_MASK32 = 0xFFFFFFFF


MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY = 0.01, 100.0


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 64
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    top_k: int = 0  # 0: whole vocabulary
    seed: int | None = None  # None: the engine draws one (output then not reproducible)
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    draft: bool = True  # per-request speculative decoding switch
    top_logprobs: int = 0  # also keep this many most likely tokens per position (0..20)
    # logits processing before sampling (lanes/penalties.py); neutral values change nothing
    presence_penalty: float = 0.0  # [-2, 2], over the output
    frequency_penalty: float = 0.0  # [-2, 2], over the output
    repetition_penalty: float = 1.0  # > 0, over prompt and output
    min_p: float = 0.0  # [0, 1]
    min_tokens: int = 0  # EOS and stop_token_ids held back until this many tokens
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias in [-100, 100])
    grammar: Grammar | None = None  # structured output: what the text must match

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if not self.temperature >= 0 or self.temperature == float("inf"):
            raise ValueError(f"temperature must be finite and >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be in [0, 2**63), got {self.seed}")
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")
        if not 0 <= self.top_logprobs <= 20:
            raise ValueError(f"top_logprobs must be in [0, 20], got {self.top_logprobs}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        # logits are divided or multiplied by it: past these bounds float32 logits overflow
        if not MIN_REPETITION_PENALTY <= self.repetition_penalty <= MAX_REPETITION_PENALTY:
            raise ValueError(
                f"repetition_penalty must be in [{MIN_REPETITION_PENALTY}, "
                f"{MAX_REPETITION_PENALTY}], got {self.repetition_penalty}"
            )
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be in [0, max_tokens], got {self.min_tokens}")
        if any(t < 0 or not -100 <= b <= 100 for t, b in self.logit_bias):
            raise ValueError("logit_bias maps token ids >= 0 to biases in [-100, 100]")
        if len({t for t, _ in self.logit_bias}) < len(self.logit_bias):
            raise ValueError("logit_bias names a token id twice (as '5' and '05', say)")
        if self.grammar is not None and self.min_tokens:
            # a finished grammar allows only EOS, which min_tokens would hold back
            raise ValueError("min_tokens cannot be combined with a structured output")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def processes_logits(self) -> bool:
        """Whether penalties, logit_bias, min_p, min_tokens or a grammar change this request's
        logits."""
        return bool(
            self.grammar is not None
            or self.presence_penalty
            or self.frequency_penalty
            or self.repetition_penalty != 1.0
            or self.min_p
            or self.min_tokens
            or self.logit_bias
        )

    def with_seed(self) -> SamplingParams:
        """These params with a concrete seed (drawn now if the request gave none)."""
        if self.seed is not None:
            return self
        return dataclasses.replace(self, seed=random.getrandbits(63))


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


def sample_row(
    logits: torch.Tensor, params: SamplingParams, position: int, seed: int
) -> tuple[int, torch.Tensor]:
    """One token from one row of logits [vocab]; returns (token, log-probabilities [vocab]).

    The log-probabilities are those of the distribution sampled from (after temperature), for
    `logprobs` in responses. Works on one row at a time so that every reduction has the same shape
    whatever the batch is.
    """
    logprobs = sampling_logprobs(logits, params)
    if params.is_greedy:
        return int(torch.argmax(logprobs)), logprobs
    noise = gumbel_noise(seed, position, logits.shape[-1], logits.device)
    return int(torch.argmax(logprobs + noise)), logprobs


def sampling_logprobs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Log-probabilities [vocab] of the distribution a row is sampled from: temperature, then
    top-k and top-p (-inf outside). Greedy rows give the plain log-softmax."""
    logits = logits.float()
    if params.is_greedy:
        return torch.log_softmax(logits, dim=-1)
    scaled = logits / params.temperature
    keep = _top_k_top_p_mask(scaled, params.top_k, params.top_p)
    return torch.log_softmax(scaled.masked_fill(~keep, float("-inf")), dim=-1)


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
