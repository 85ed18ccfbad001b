"""Prompt logprobs: how likely the model finds each prompt token given the ones before it, for
completions' `echo` with `logprobs` (lm-evaluation-harness's loglikelihood tasks) and vLLM's
`prompt_logprobs`.

Scored on the engine thread by one forward over the whole prompt (Engine.prompt_logits: the same
batch-invariant kernels as a prefill, so a position's logits are the bits any prefill of it
gives), from the raw logits (no temperature or processing, as vLLM reports them). The first
prompt token has no logprob (None), as in OpenAI's and vLLM's responses.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

ROWS_AT_ONCE = 512  # log-softmax over this many positions at a time (a row is vocab floats)


@dataclass(frozen=True)
class PromptScores:
    token_ids: list[int]
    logprobs: list[float | None]  # per position: log p(token | the tokens before); None first
    ranks: list[int | None]  # 1: the model's most likely token there
    top: list[list[tuple[int, float]] | None]  # the num_top most likely tokens, best first


def score_prompts(engine, prompts: list[list[int]], num_top: int) -> list[PromptScores]:
    """Each prompt's scores (engine thread), one prompt per forward: a prompt's logits are
    [len, vocab] floats."""
    return [_score(engine.prompt_logits([ids])[0], ids, num_top) for ids in prompts]


def _score(logits: torch.Tensor, ids: list[int], num_top: int) -> PromptScores:
    logprobs: list[float | None] = [None]
    ranks: list[int | None] = [None]
    top: list[list[tuple[int, float]] | None] = [None]
    nxt = torch.tensor(ids[1:], dtype=torch.int64)
    for start in range(0, len(ids) - 1, ROWS_AT_ONCE):
        end = min(start + ROWS_AT_ONCE, len(ids) - 1)
        lp = torch.log_softmax(logits[start:end].float(), dim=-1)  # row r predicts ids[r + 1]
        chosen = lp.gather(1, nxt[start:end].to(lp.device).view(-1, 1))  # [rows, 1]
        logprobs += chosen.view(-1).tolist()
        ranks += ((lp > chosen).sum(dim=1) + 1).tolist()
        if num_top:
            best = torch.topk(lp, num_top, dim=1)
            top += [
                list(zip(i, v, strict=True))
                for i, v in zip(best.indices.tolist(), best.values.tolist(), strict=True)
            ]
        else:
            top += [[] for _ in range(end - start)]
    return PromptScores(list(ids), logprobs, ranks, top)
