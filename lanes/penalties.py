"""Logits processing before sampling: allowed and banned tokens, penalties, logit_bias, min_p,
min_tokens.

Each is a pure function of the row's logits and the tokens before its position (the prompt, the
output so far, and in a verify step the drafts before that row), so a position's processed
logits are the same whether it is decoded alone or verified behind drafts: drafted output still
equals undrafted. The order, vLLM's: allowed_token_ids and bad words (tokens set to -inf), logit_bias, min_tokens, then the repetition penalty over
prompt and output, then presence and frequency penalties over the output (OpenAI's), then
min_p (relative to the most likely token at the sampling temperature).

    presence/frequency: logit[t] -= presence * (count[t] > 0) + frequency * count[t]
    repetition (p):     logit[t] = logit[t] / p if logit[t] > 0 else logit[t] * p, t seen anywhere
    min_p (m, T):       keep t iff p(t) >= m * p_max  <=>  logit[t] >= max + T * ln(m)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

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
    if params.allowed_token_ids:
        keep = torch.zeros(vocab, dtype=torch.bool)
        keep[[t for t in params.allowed_token_ids if t < vocab]] = True
        out = out.masked_fill(~keep.to(out.device), float("-inf"))
    banned = [t for t in banned_by_words(params.bad_words_ids, output_ids) if t < vocab]
    if banned:
        out[torch.tensor(banned, dtype=torch.int64, device=out.device)] = float("-inf")
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


def banned_by_words(words: Sequence[Sequence[int]], output_ids: Sequence[int]) -> list[int]:
    """vLLM's bad words: the last token of each word whose other tokens end the output (a
    one-token word is always banned).

    Example: words [[7], [4, 5, 6]], output [.., 4, 5] -> [7, 6]; output [.., 5] -> [7]."""
    n = len(output_ids)
    out = []
    for word in words:
        k = len(word) - 1
        if k <= n and all(output_ids[n - k + j] == word[j] for j in range(k)):
            out.append(word[-1])
    return out


@dataclass(frozen=True)
class RowContext:
    """What one logits row's processing reads (process_logits' arguments, plain data), and the
    grammar's allowed tokens at its position (bool [vocab] on the host; None: no grammar)."""

    params: SamplingParams
    prompt_ids: Sequence[int]
    output_ids: Sequence[int]
    stop_ids: frozenset[int]
    allowed: torch.Tensor | None = None


def process_rows(logits: torch.Tensor, rows: Sequence[RowContext]) -> torch.Tensor:
    """logits [R, vocab] -> float32 [R, vocab]: row i as apply_mask (its grammar) then
    process_logits would give it, for all rows at once on logits' device: the host's index lists
    travel in one copy per kind, and each step is one elementwise op over the rows it concerns,
    so a row's values are the same bits as when it is processed alone."""
    out = logits.float().clone()
    vocab, device = out.shape[1], out.device

    def upload(values, dtype) -> torch.Tensor:
        pinned = torch.tensor(values, dtype=dtype, pin_memory=device.type == "cuda")
        return pinned.to(device, non_blocking=True)

    def cells(pairs) -> tuple[torch.Tensor, torch.Tensor]:  # (row ids, token ids)
        flat = upload([x for pair in pairs for x in pair], torch.int64).view(-1, 2)
        return flat[:, 0], flat[:, 1]

    def per_row(values) -> torch.Tensor:  # a row's scalar, as a column
        return upload(values, torch.float32).view(-1, 1)

    masked = [i for i, r in enumerate(rows) if r.allowed is not None]
    if masked:
        allowed = torch.stack([rows[i].allowed for i in masked])
        if device.type == "cuda":
            allowed = allowed.pin_memory()
        idx = upload(masked, torch.int64)
        forbidden = ~allowed.to(device, non_blocking=True)
        out[idx] = out[idx].masked_fill(forbidden, float("-inf"))
    limited = [i for i, r in enumerate(rows) if r.params.allowed_token_ids]
    if limited:
        keep = torch.zeros((len(limited), vocab), dtype=torch.bool, device=device)
        ids = [(j, t) for j, i in enumerate(limited) for t in rows[i].params.allowed_token_ids
               if t < vocab]  # fmt: skip
        if ids:
            keep[cells(ids)] = True
        idx = upload(limited, torch.int64)
        out[idx] = out[idx].masked_fill(~keep, float("-inf"))
    banned = [
        (i, t)
        for i, r in enumerate(rows)
        for t in banned_by_words(r.params.bad_words_ids, r.output_ids)
        if t < vocab
    ]
    if banned:
        out[cells(banned)] = float("-inf")
    biased = [(i, t, b) for i, r in enumerate(rows) for t, b in r.params.logit_bias]
    if biased:
        at = cells([(i, t) for i, t, _ in biased])
        out.index_put_(at, upload([b for *_, b in biased], torch.float32), accumulate=True)
    held = [
        (i, t)
        for i, r in enumerate(rows)
        if len(r.output_ids) < r.params.min_tokens
        for t in sorted(r.stop_ids)
        if t < vocab
    ]
    if held:
        out[cells(held)] = float("-inf")
    repeating = [i for i, r in enumerate(rows) if r.params.repetition_penalty != 1.0]
    if repeating:
        seen = torch.zeros((len(repeating), vocab), dtype=torch.bool, device=device)
        ids = [
            (j, t)
            for j, i in enumerate(repeating)
            for t in (*rows[i].prompt_ids, *rows[i].output_ids)
            if 0 <= t < vocab
        ]
        if ids:
            seen[cells(ids)] = True
        p = per_row([rows[i].params.repetition_penalty for i in repeating])
        idx = upload(repeating, torch.int64)
        part = out[idx]
        out[idx] = torch.where(seen, torch.where(part > 0, part / p, part * p), part)
    penalised = [
        i
        for i, r in enumerate(rows)
        if (r.params.presence_penalty or r.params.frequency_penalty) and r.output_ids
    ]
    if penalised:
        counts = torch.zeros((len(penalised), vocab), dtype=torch.float32, device=device)
        ids = [
            (j, t) for j, i in enumerate(penalised) for t in rows[i].output_ids if 0 <= t < vocab
        ]
        if ids:
            counts.index_put_(cells(ids), torch.ones(len(ids), device=device), accumulate=True)
        frequency = per_row([rows[i].params.frequency_penalty for i in penalised])
        presence = per_row([rows[i].params.presence_penalty for i in penalised])
        idx = upload(penalised, torch.int64)
        out[idx] = out[idx] - (frequency * counts + presence * (counts > 0).float())
    floored = [i for i, r in enumerate(rows) if r.params.min_p > 0 and not r.params.is_greedy]
    if floored:
        idx = upload(floored, torch.int64)
        part = out[idx]
        shift = [rows[i].params.temperature * math.log(rows[i].params.min_p) for i in floored]
        floor = part.max(dim=-1, keepdim=True).values + per_row(shift)
        out[idx] = part.masked_fill(part < floor, float("-inf"))
    return out
