"""The verifier: a forward's logits rows become each step's emitted tokens — sampled, checked
against the step's drafts, with logprobs.

Three paths, chosen by a lane's parameters and the engine's mode alone (so each lane always
takes one, and the equalities never compare two):
- rows sampled by the batched device sampler in one launch (greedy, or position-keyed under
  coupled verification), read back in the forward's one copy together with drafts still on the
  device (`read_back`);
- rows whose logits processing (grammar, penalties, logit_bias, min_p, min_tokens) runs batched
  on the device first (`sample_processed`);
- the host path, row by row (the CPU, rejection verification, top_logprobs): `verify_on_host`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from lanes.config import EngineConfig
from lanes.device_sampling import ParamsOnDevice, sample_rows, to_host
from lanes.grammar import apply_mask
from lanes.mask_prefetch import MaskPrefetch
from lanes.penalties import RowContext, process_logits, process_rows
from lanes.rounds import Step
from lanes.sampling import SamplingParams, sample_row
from lanes.speculation import processes_on_device, samples_on_device, verify, walk_branches

Emitted = list[tuple[int, float, list[tuple[int, float]] | None]]  # (token, logprob, top)


class Verifier:
    def __init__(
        self,
        config: EngineConfig,
        on_triton: bool,
        row_params: ParamsOnDevice,
        masks: MaskPrefetch,
        eos_token_ids: frozenset[int],
    ) -> None:
        self.verify_mode = config.verify_mode
        self.on_triton = on_triton  # the device sampler exists (Triton kernels)
        self.row_params = row_params
        self.masks = masks
        self.eos_token_ids = eos_token_ids

    def samples_on_device(self, params: SamplingParams) -> bool:
        return samples_on_device(params, self.verify_mode)

    def processed_on_device(self, params: SamplingParams) -> bool:
        """A lane whose logits processing runs batched on the device, its rows then sampled by
        the device sampler. Never in an overlapped round or a device round: its next row's mask
        needs this row's token."""
        return self.on_triton and processes_on_device(params, self.verify_mode)

    def read_back(
        self, steps: Sequence[Step], logits: torch.Tensor
    ) -> tuple[tuple[list, list] | None, list[Step]]:
        """What the host needs of a forward, in one copy: with the Triton kernels, the rows of
        every lane that samples on the device, sampled in one launch; and the drafts of verify
        steps whose drafts are still on the device. Returns (tokens, logprobs) by logits row
        (None for rows not sampled here; None: no row was), and the steps with their draft ids
        on the host."""
        where = []  # logits rows the device samples
        how = []  # (params, position) of each of them
        processed = []  # (index in steps, first logits row) of steps processed on the device
        row = 0
        for i, s in enumerate(steps):
            if not s.samples:
                continue
            if self.on_triton and self.samples_on_device(s.lane.params):
                where += range(row, row + s.num_logits_rows)
                first = s.first_sample_position
                how += [(s.lane.params, first + j) for j in range(s.num_logits)]
                for drafts in s.branches:  # a branch's rows stand after the same root
                    how += [(s.lane.params, first + j) for j in range(1 + len(drafts))]
            elif self.processed_on_device(s.lane.params):
                processed.append((i, row))
            row += s.num_logits_rows
        sources = list(
            {
                id(s.draft_source): s.draft_source for s in steps if s.draft_source is not None
            }.values()
        )
        if not where and not sources and not processed:
            return None, list(steps)
        parts = []
        if where:
            rows = logits
            if len(where) < logits.shape[0]:
                rows = logits[torch.tensor(where).to(logits.device, non_blocking=True)]
            parts += sample_rows(rows, how, True, self.row_params)
        values = to_host(*parts, *sources)
        by_source = {id(src): v for src, v in zip(sources, values[len(parts) :], strict=True)}
        steps = [
            s
            if s.draft_source is None
            else dataclasses.replace(
                s,
                draft_ids=tuple(int(by_source[id(s.draft_source)][r]) for r in s.draft_rows),
                draft_rows=(),
                draft_source=None,
            )
            for s in steps
        ]
        by_row: tuple[list, list] = ([None] * row, [None] * row)
        for i, r in enumerate(where):
            by_row[0][r], by_row[1][r] = int(values[0][i]), values[1][i]
        if processed:  # their rows' masks and penalties need the drafts on the host first
            at, tokens, logprobs = self.sample_processed(
                [(steps[i], first) for i, first in processed], logits
            )
            for i, r in enumerate(at):
                by_row[0][r], by_row[1][r] = int(tokens[i]), logprobs[i]
        return by_row, steps

    def held_by_min_tokens(self, p: SamplingParams) -> frozenset[int]:
        """The tokens min_tokens holds back: the stop ids, and EOS unless ignored."""
        return frozenset(p.stop_token_ids) | (frozenset() if p.ignore_eos else self.eos_token_ids)

    def sample_processed(
        self, steps: Sequence[tuple[Step, int]], logits: torch.Tensor
    ) -> tuple[list[int], list[float], list[float]]:
        """The rows of (step, its first logits row) pairs whose processing runs on the device:
        each row's context (the lane's prompt, output and the drafts before the row; its grammar
        mask), processed in one batch (lanes.penalties.process_rows) and sampled in one launch.
        Returns (logits rows, tokens, logprobs). A grammar's masks stop at the first draft it
        forbids: that row's sample cannot equal the draft, so no later row of the step is used."""
        at, contexts, how = [], [], []
        for s, row in steps:
            lane, p = s.lane, s.lane.params
            stops = self.held_by_min_tokens(p)
            allowed = None
            for j in range(s.num_logits):
                history = self.row_history(s, j)
                if lane.grammar_cursor is not None and (
                    allowed is None or bool(allowed[history[-1]])
                ):
                    allowed = self.masks.allowed(lane, history)
                at.append(row + j)
                contexts.append(RowContext(p, lane.prompt_ids, history, stops, allowed))
                how.append((p, s.first_sample_position + j))
        rows = logits[torch.tensor(at).to(logits.device, non_blocking=True)]
        tokens, logprobs = to_host(*sample_rows(process_rows(rows, contexts), how, True))
        return at, tokens, logprobs

    def verify_on_host(self, s: Step, rows: torch.Tensor) -> Emitted:
        """Sample and verify one step's logits rows [num_logits, vocab] row by row (the CPU path,
        rejection verification, top_logprobs): tokens with logprob and top alternatives."""
        p, lane = s.lane.params, s.lane
        process = None
        if p.processes_logits:  # penalties etc. over the output so far and the drafts before
            stops = self.held_by_min_tokens(p)

            def process(j: int, row: torch.Tensor) -> torch.Tensor:
                history = self.row_history(s, j)
                if lane.grammar_cursor is not None:  # the grammar first: min_p then sees
                    row = apply_mask(row, self.masks.allowed(lane, history))  # allowed only
                return process_logits(row, p, lane.prompt_ids, history, stops)

        emitted = verify(
            self.verify_mode, rows, s.draft_ids, s.draft_logprobs, p, s.first_sample_position,
            process,
        )  # fmt: skip
        return [self._emitted(p, token, logprobs) for token, logprobs in emitted]

    def verify_branches_on_host(self, s: Step, rows: torch.Tensor) -> tuple[Emitted, int]:
        """A step with draft branches, sampled on the host along the walk alone
        (lanes.speculation.walk_branches): (emitted, the branch followed).
        rows: every logits row of the step, its own then each branch's."""
        p = s.lane.params
        starts = [0]
        for drafts in s.draft_paths:
            starts.append(starts[-1] + 1 + len(drafts))

        def sample_at(branch: int, j: int) -> tuple[int, torch.Tensor]:
            return sample_row(rows[starts[branch] + j], p, s.first_sample_position + j, p.seed)

        walked, branch, _ = walk_branches(s.draft_paths, sample_at)
        return [self._emitted(p, t, lp) for t, lp in walked], branch

    @staticmethod
    def _emitted(p: SamplingParams, token: int, logprobs: torch.Tensor):
        top = None
        if p.top_logprobs:
            best = torch.topk(logprobs, p.top_logprobs)
            top = list(zip(best.indices.tolist(), best.values.tolist(), strict=True))
        return token, float(logprobs[token]), top

    @staticmethod
    def row_history(s: Step, j: int) -> list[int]:
        """The output before row j of a sampling step: the lane's, then the drafts before j."""
        return s.lane.output_ids + list(s.draft_ids[:j])
