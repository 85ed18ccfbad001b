"""Tokens of many logits rows at once, left on the device: what overlapped rounds, the batched
read-back of a forward and device-chained drafting read from, without a copy to the host each.

Triton's kernels (lanes.kernels.sampling: greedy_tokens, and sample_tokens for position-keyed
sampled rows) where the ops are Triton; elsewhere the host path's own functions, so a lane's
tokens are those of lanes.sampling.sample_row on either path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from lanes.sampling import SamplingParams


def greedy_rows(logits: torch.Tensor, use_triton: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens int64 [R], logprobs fp32 [R]) of logits [R, vocab], on logits' device."""
    from lanes.kernels.sampling import greedy_tokens, ref_greedy_tokens

    logits = logits.contiguous()
    return greedy_tokens(logits) if use_triton else ref_greedy_tokens(logits)


def upload_params(params: Sequence[SamplingParams | None], device):
    """The sampling kernel's RowParams of these lanes (None: a padding row, greedy), copied to
    the device asynchronously."""
    from lanes.kernels.sampling import RowParams

    return RowParams.upload(
        [p.temperature if p else 0.0 for p in params],
        [p.top_k if p else 0 for p in params],
        [p.top_p if p else 1.0 for p in params],
        [(p.seed or 0) if p else 0 for p in params],
        device,
    )


class ParamsOnDevice:
    """The device copy of the last rows' sampling parameters, kept by the runner:
    steady decode samples the same lanes round after round, so only their positions need to
    travel. New parameters get new tensors; a launch in flight keeps reading its own."""

    def __init__(self) -> None:
        self.key: tuple | None = None
        self.params = None

    def get(self, rows: Sequence[tuple[SamplingParams, int]], device: torch.device):
        key = (device, *((p.temperature, p.top_k, p.top_p, p.seed or 0) for p, _ in rows))
        if key != self.key:
            self.params = upload_params([p for p, _ in rows], device)
            self.key = key
        return self.params


def sample_rows(
    logits: torch.Tensor,
    rows: Sequence[tuple[SamplingParams, int]],
    use_triton: bool,
    on_device: ParamsOnDevice | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row of logits [R, vocab], row i sampled with rows[i] = (params, position):
    greedy, or position-keyed with temperature, top-k and top-p (params.seed set). Returns
    (tokens int64 [R], logprobs fp32 [R]) on logits' device: each token's log-probability under
    the distribution it was sampled from. All-greedy rows take the parameter-free kernel;
    `on_device` keeps the rows' parameters on the device between calls."""
    if all(p.is_greedy for p, _ in rows):
        return greedy_rows(logits, use_triton)
    from lanes.kernels.sampling import sample_with
    from lanes.sampling import sample_row

    logits = logits.contiguous()
    if not use_triton:  # the host path's function, row by row
        drawn = [sample_row(logits[i], p, pos, p.seed) for i, (p, pos) in enumerate(rows)]
        tokens = torch.tensor([t for t, _ in drawn], dtype=torch.int64)
        logprobs = torch.stack([lp[t].float().cpu() for t, lp in drawn])
        return tokens.to(logits.device), logprobs.to(logits.device)
    device = logits.device
    positions = torch.tensor(
        [pos for _, pos in rows], dtype=torch.int64, pin_memory=device.type == "cuda"
    ).to(device, non_blocking=True)
    params = (on_device or ParamsOnDevice()).get(rows, device)
    return sample_with(logits, params, positions)


def to_host(*tensors: torch.Tensor) -> list[list[float]]:
    """1-D device tensors read back in one copy, as float64 (exact for token ids < 2**53)."""
    if not tensors:
        return []
    values = torch.cat([t.reshape(-1).double() for t in tensors]).tolist()
    out, i = [], 0
    for t in tensors:
        out.append(values[i : i + t.numel()])
        i += t.numel()
    return out


class DeviceChain:
    """Draft tokens made one forward after another on the device, each forward reading the one
    before's tokens (Step.pending_row), and left there for the verify forward (`drafts`)."""

    def __init__(self, use_triton: bool) -> None:
        self.use_triton = use_triton
        # (tokens [n], their lanes' keys; None: a row that is no lane's draft)
        self._parts: list[tuple[torch.Tensor, list[int | None]]] = []

    def greedy(self, logits: torch.Tensor, ends: Sequence[int], keys: list[int]) -> torch.Tensor:
        """The greedy token of each step's last logits row (ends: cumulative rows per step);
        returns them [len(ends)] on the device, for the next forward's pending rows."""
        if ends[-1] != len(ends):  # some step asked for more rows than its last
            index = torch.tensor([e - 1 for e in ends], dtype=torch.int64)
            logits = logits.index_select(0, index.to(logits.device, non_blocking=True))
        tokens, _ = greedy_rows(logits, self.use_triton)
        self._parts.append((tokens, keys))
        return tokens

    def extend(self, tokens: torch.Tensor, keys: list[int], counts: Sequence[int]) -> None:
        """Steps chained in one graph (lanes.chain_graphs): tokens [S, len(keys)], of which lane
        i's drafts are rows 0..counts[i]-1."""
        pairs = list(zip(keys, counts, strict=True))
        for j in range(tokens.shape[0]):
            self._parts.append((tokens[j], [k if j < c else None for k, c in pairs]))

    def drafts(self) -> dict[int, tuple[torch.Tensor, tuple[int, ...]]]:
        """Every lane's tokens left on the device: (source [all tokens], the lane's rows of it
        in draft order). Nothing waits for the drafter's forwards."""
        if not self._parts:
            return {}
        source = torch.cat([t for t, _ in self._parts])
        rows: dict[int, list[int]] = {}
        i = 0
        for _, keys in self._parts:
            for key in keys:
                if key is not None:
                    rows.setdefault(key, []).append(i)
                i += 1
        return {key: (source, tuple(r)) for key, r in rows.items()}
