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

from lanes.grammar_spec import Grammar
from lanes.sample_math import (  # noqa: F401  (re-exported: the noise is part of sampling's API)
    STREAM_ACCEPT,
    STREAM_RESIDUAL,
    STREAM_TOKEN,
    gumbel_noise,
    noise_hash,
    row_logprobs,
    sample_token,
    uniform_at,
    uniform_noise,
)

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
    # vLLM's: only these tokens may be sampled (empty: any)
    allowed_token_ids: tuple[int, ...] = ()
    # vLLM's bad_words: the engine turns each into token sequences (bad_words_ids) at intake; a
    # sequence's last token is banned where the output ends with the tokens before it
    bad_words: tuple[str, ...] = ()
    bad_words_ids: tuple[tuple[int, ...], ...] = ()
    include_stop_str_in_output: bool = False  # the text keeps the stop string that ended it
    truncate_prompt_tokens: int | None = None  # keep only the prompt's last N tokens

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
        if any(t < 0 for t in self.allowed_token_ids):
            raise ValueError("allowed_token_ids must be token ids >= 0")
        if any(not word for word in self.bad_words) or any(not ids for ids in self.bad_words_ids):
            raise ValueError("bad_words must be non-empty")
        if self.truncate_prompt_tokens is not None and self.truncate_prompt_tokens < 1:
            raise ValueError(
                f"truncate_prompt_tokens must be at least 1, got {self.truncate_prompt_tokens}"
            )
        if self.grammar is not None and self.min_tokens:
            # a finished grammar allows only EOS, which min_tokens would hold back
            raise ValueError("min_tokens cannot be combined with a structured output")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def processes_logits(self) -> bool:
        """Whether penalties, logit_bias, min_p, min_tokens, allowed or bad tokens, or a grammar
        change this request's logits."""
        return bool(
            self.grammar is not None
            or self.allowed_token_ids
            or self.bad_words_ids
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


def sample_row(
    logits: torch.Tensor, params: SamplingParams, position: int, seed: int
) -> tuple[int, torch.Tensor]:
    """One token from one row of logits [vocab]; returns (token, log-probabilities [vocab]).

    The log-probabilities are those of the distribution sampled from (after temperature), for
    `logprobs` in responses (lanes/sample_math.py has the math)."""
    p = params
    return sample_token(logits, p.temperature, p.top_k, p.top_p, seed, position)


def ranked_tokens(logits: torch.Tensor, params: SamplingParams, position: int, n: int) -> list[int]:
    """The n likeliest samples of one row [vocab], best first: `sample_row`'s token, then the
    next by the same perturbed scores (log-probabilities plus the position's noise; plain
    log-probabilities when greedy), tokens outside top-k / top-p left out. A drafter's
    candidates for the roots of draft branches."""
    p = params
    first, logprobs = sample_token(logits, p.temperature, p.top_k, p.top_p, p.seed, position)
    if n <= 1:
        return [first]
    scores = logprobs
    if not p.is_greedy:
        scores = logprobs + gumbel_noise(p.seed, position, logits.shape[-1], logits.device)
    best = torch.topk(scores, min(n, scores.shape[-1]))
    rest = [
        int(t)
        for t, v in zip(best.indices.tolist(), best.values.tolist(), strict=True)
        if t != first and v != float("-inf")
    ]
    return [first, *rest][:n]


def sampling_logprobs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Log-probabilities [vocab] of the distribution a row is sampled from."""
    return row_logprobs(logits, params.temperature, params.top_k, params.top_p)
