"""A decode forward launched and sampled on the device (greedy or seeded rows) but not yet read
back.

Overlapped rounds: while round N runs, the host launches round N+1 on top of N's samples (each
lane's next input is row r of N's tokens, copied device to device: `Step.pending_row`), and only
then waits for N's tokens to reach the host. The tokens of N+1 are the ones the synchronous path
computes: the same inputs, batch-invariant numerics. A lane that stops in N (a stop token or
string found when its tokens are read) has one row of N+1 computed for nothing; its output is
cut at N exactly as in the synchronous path.

    host:   plan N | launch N | plan+launch N+1 | take N | plan+launch N+2 | take N+1 | ...
    device:          [   N   ][      N+1       ][      N+2      ] ...
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from lanes.device_sampling import ParamsOnDevice, sample_rows
from lanes.rounds import Step


@dataclass
class InFlight:
    steps: tuple[Step, ...]  # one token each; row i of the samples is steps[i]'s token
    tokens: torch.Tensor  # [num_steps] int64 on the device: what the next round reads
    host: torch.Tensor  # [2, num_steps] float64 (pinned on CUDA): tokens, logprobs, once ready
    ready: torch.cuda.Event | None  # the copy to `host` is done; None: it was synchronous
    hidden: torch.Tensor | None = None  # [num_steps, features]: what a drafter observes, or None

    def results(self) -> tuple[list[int], list[float]]:
        """(tokens, logprobs) by step; waits for this forward alone, not for later launches."""
        if self.ready is not None:
            self.ready.synchronize()
        tokens, logprobs = self.host.tolist()
        return [int(t) for t in tokens], logprobs


def launch_samples(
    steps: Sequence[Step],
    logits: torch.Tensor,
    use_triton: bool,
    hidden: torch.Tensor | None = None,
    on_device: ParamsOnDevice | None = None,
) -> InFlight:
    """Each step's token from its logits row [num_steps, vocab] (greedy or position-keyed, as the
    synchronous path samples it) and its logprob, left on the device, with one asynchronous copy
    to the host."""
    rows = [(s.lane.params, s.first_sample_position) for s in steps]
    tokens, logprobs = sample_rows(logits, rows, use_triton, on_device)
    both = torch.stack([tokens.double(), logprobs.double()])  # token ids < 2**53: exact
    if not both.is_cuda:
        return InFlight(tuple(steps), tokens, both, None, hidden)
    host = torch.empty(both.shape, dtype=both.dtype, pin_memory=True)
    host.copy_(both, non_blocking=True)
    ready = torch.cuda.Event()
    ready.record()
    return InFlight(tuple(steps), tokens, host, ready, hidden)
