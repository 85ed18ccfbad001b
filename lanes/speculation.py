"""Speculative verification: which drafted tokens the target keeps (how many to draft:
lanes/drafting.py).

`coupled` (default): the target samples its own token at every drafted position with the same
position-keyed noise as undrafted decoding; a draft is kept iff it equals that token, and the
first mismatch emits the target's token. The output is therefore exactly the undrafted output.

`rejection` (Leviathan et al. / Chen et al.): a draft d is kept with probability
min(1, p(d) / q(d)); on rejection a token is drawn from the normalised residual max(0, p - q).
The output follows the target's distribution but is not the undrafted stream token for token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

from lanes.sampling import (
    STREAM_ACCEPT,
    STREAM_RESIDUAL,
    SamplingParams,
    gumbel_noise,
    sample_row,
    sampling_logprobs,
    uniform_at,
)

VERIFY_MODES = ("coupled", "rejection")


def verify(
    mode: str,
    logits: torch.Tensor,
    drafts: tuple[int, ...],
    draft_logprobs: torch.Tensor | None,
    params: SamplingParams,
    first_position: int,
    process: Callable[[int, torch.Tensor], torch.Tensor] | None = None,
) -> list[tuple[int, torch.Tensor]]:
    """Tokens the target emits for one verify step, each with the log-probabilities [vocab] of
    the distribution it was sampled from.

    logits [len(drafts) + 1, vocab]: row j predicts position first_position + j, where draft j
    stands. draft_logprobs [len(drafts), vocab] is the drafter's sampling distribution (rejection
    mode; None for drafters that propose deterministically). Emits the kept drafts and one more
    token: the correction at the first rejection, or the bonus after the last draft.
    process(j, row): row j's logits processing (lanes.penalties), which sees the drafts before
    row j as output: a position's logits are those of undrafted decoding.
    """

    def row(j: int) -> torch.Tensor:
        return logits[j] if process is None else process(j, logits[j])

    if mode == "rejection" and not params.is_greedy:
        return _verify_rejection(row, len(drafts), drafts, draft_logprobs, params, first_position)
    out = []
    for j in range(len(drafts) + 1):
        token, logprobs = sample_row(row(j), params, first_position + j, params.seed)
        out.append((token, logprobs))
        if j == len(drafts) or token != drafts[j]:
            break
    return out


def samples_on_device(params: SamplingParams, verify_mode: str) -> bool:
    """Whether a lane's rows are sampled by the batched device sampler (one launch for every such
    row of a forward, lanes.device_sampling.sample_rows): greedy rows, and position-keyed sampled
    rows under coupled verification, without top_logprobs or logits processing. The rest take the
    host path (`verify`). The choice depends on the lane's parameters and the engine's mode
    alone, so each lane always takes one path: the equalities never compare the two."""
    return (
        params.top_logprobs == 0
        and not params.processes_logits
        and (params.is_greedy or verify_mode == "coupled")
    )


def processes_on_device(params: SamplingParams, verify_mode: str) -> bool:
    """Whether a lane's rows are processed (lanes.penalties.process_rows) and sampled in a batch
    on the device: those samples_on_device leaves out for their logits processing alone. Also a
    function of the parameters and mode only."""
    return (
        params.top_logprobs == 0
        and params.processes_logits
        and (params.is_greedy or verify_mode == "coupled")
    )


def coupled_from_samples(
    drafts: tuple[int, ...], tokens: list[int], logprobs: list[float]
) -> list[tuple[int, float]]:
    """Coupled verification over rows already sampled: the kept drafts and one more token (the
    correction at the first mismatch, or the bonus after the last draft), with logprobs."""
    out = []
    for j, token in enumerate(tokens[: len(drafts) + 1]):
        out.append((token, logprobs[j]))
        if j == len(drafts) or token != drafts[j]:
            break
    return out


Sample = TypeVar("Sample")


def coupled_branches_from_samples(
    paths: Sequence[Sequence[int]], tokens: list[int], logprobs: list[float]
) -> tuple[list[tuple[int, float]], int]:
    """`walk_branches` over rows already sampled (each branch's rows after the previous
    branch's): the emitted tokens with logprobs, and the branch followed."""
    starts = [0]
    for drafts in paths:
        starts.append(starts[-1] + 1 + len(drafts))
    emitted, branch, _ = walk_branches(
        paths, lambda b, j: (tokens[starts[b] + j], logprobs[starts[b] + j])
    )
    return emitted, branch


def walk_branches(
    paths: Sequence[Sequence[int]], sample_at: Callable[[int, int], tuple[int, Sample]]
) -> tuple[list[tuple[int, Sample]], int, int]:
    """Coupled verification of a draft tree given as root-to-leaf paths (branch b's drafts
    paths[b]; row j of a branch predicts the token after its root and j drafts). From the root,
    the target's own sample at each depth picks the branches whose next draft equals it, and
    the walk goes on along them; the first depth none continues emits that sample and ends. So
    the emitted tokens are the ones undrafted decoding samples, whatever the tree holds.

    sample_at(b, j): the target's sample at row j of branch b, (token, anything kept with it);
    asked only along the walk, of the lowest branch still followed (branches that agree so far
    hold the same tokens, so their rows have the same bits). Returns (emitted, the branch
    followed last, the number of its drafts kept)."""
    alive = list(range(len(paths)))
    out = []
    depth = 0
    while True:
        branch = alive[0]
        token, kept = sample_at(branch, depth)
        out.append((token, kept))
        alive = [b for b in alive if depth < len(paths[b]) and paths[b][depth] == token]
        if not alive:
            return out, branch, depth
        depth += 1


def _verify_rejection(row, num_rows, drafts, draft_logprobs, params, first_position):
    """row(j): row j's (processed) logits; num_rows = len(drafts)."""
    seed = params.seed
    out = []
    for j, d in enumerate(drafts):
        pos = first_position + j
        logp = sampling_logprobs(row(j), params)
        p = logp.exp()
        if draft_logprobs is None:
            q = torch.zeros_like(p)
            q[d] = 1.0
        else:
            q = draft_logprobs[j].float().exp()
        u = uniform_at(seed, pos, STREAM_ACCEPT)
        if u * q[d] < p[d]:  # kept with probability min(1, p(d) / q(d))
            out.append((d, logp))
            continue
        residual = torch.clamp(p - q, min=0.0)
        if float(residual.sum()) <= 0.0:  # p == q up to rounding: any draw from p is right
            residual = p
        noise = gumbel_noise(seed, pos, p.shape[-1], p.device, STREAM_RESIDUAL)
        token = int(torch.argmax(torch.log(residual) + noise))
        out.append((token, logp))
        return out
    token, logprobs = sample_row(row(num_rows), params, first_position + num_rows, seed)
    out.append((token, logprobs))
    return out
