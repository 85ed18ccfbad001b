"""Logits processing before sampling: penalties, logit_bias, min_p, min_tokens.

Each is a pure function of the row's logits and the tokens before its position (the prompt, the
output so far, and in a verify step the drafts before that row), so a position's processed
logits are the same whether it is decoded alone or verified behind drafts: drafted output still
equals undrafted. The order, vLLM's: logit_bias, min_tokens, then the repetition penalty over
prompt and output, then presence and frequency penalties over the output (OpenAI's), then
min_p (relative to the most likely token at the sampling temperature).

    presence/frequency: logit[t] -= presence * (count[t] > 0) + frequency * count[t]
    repetition (p):     logit[t] = logit[t] / p if logit[t] > 0 else logit[t] * p, t seen anywhere
    min_p (m, T):       keep t iff p(t) >= m * p_max  <=>  logit[t] >= max + T * ln(m)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from lanes.sampling import SamplingParams


def process_logits(
    logits: torch.Tensor,  # [vocab]
    params: SamplingParams,
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],  # the tokens after the prompt and before this row's position
    stop_ids: frozenset[int],  # what min_tokens holds back: EOS (unless ignored) and stop ids
) -> torch.Tensor:
    """The row's logits (float32) as sampling should see them; unchanged when no field is set."""
    if not params.processes_logits:
        return logits
    out = logits.float().clone()
    vocab = out.shape[0]
    if params.logit_bias:
        ids = torch.tensor([t for t, _ in params.logit_bias], dtype=torch.int64)
        bias = torch.tensor([b for _, b in params.logit_bias], dtype=torch.float32)
        out.index_add_(0, ids.to(out.device), bias.to(out.device))
    if len(output_ids) < params.min_tokens and stop_ids:
        held = torch.tensor(sorted(t for t in stop_ids if t < vocab), dtype=torch.int64)
        out[held.to(out.device)] = float("-inf")
    if params.repetition_penalty != 1.0:
        seen = torch.zeros(vocab, dtype=torch.bool, device=out.device)
        ids = [t for t in (*prompt_ids, *output_ids) if 0 <= t < vocab]
        if ids:
            seen[torch.tensor(ids, dtype=torch.int64, device=out.device)] = True
        p = params.repetition_penalty
        out = torch.where(seen, torch.where(out > 0, out / p, out * p), out)
    if (params.presence_penalty or params.frequency_penalty) and output_ids:
        counts = torch.bincount(
            torch.tensor([t for t in output_ids if 0 <= t < vocab], dtype=torch.int64),
            minlength=vocab,
        ).to(device=out.device, dtype=torch.float32)
        out -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0).float()
    if params.min_p > 0 and not params.is_greedy:
        floor = out.max() + params.temperature * math.log(params.min_p)
        out = out.masked_fill(out < floor, float("-inf"))
    return out
