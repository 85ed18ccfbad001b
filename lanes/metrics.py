"""Engine metrics: what each round did and how long it took, and running totals."""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RoundRecord:
    prefill_tokens: int
    decode_tokens: int
    num_forwards: int
    seconds: float  # wall time of the round's forwards and sampling (overlapped: since the last)
    host_seconds: float  # planning and bookkeeping outside the forwards (overlapped: 0)
    prefill_share: float  # this round's share of wall time attributed to prompt work
    overlapped: bool = False  # launched on the previous round's device tokens (lanes.inflight)
    drafts: int = 0  # draft tokens verified in the round
    drafter_seconds: float = 0.0  # the drafter's share of `seconds` (host-managed rounds)
    device_round: bool = False  # a drafted round on the device (lanes/device_rounds.py)


def add_counts(total: list[int], more: list[int]) -> None:
    """Add per-position counts into `total` (growing it as needed)."""
    total.extend([0] * (len(more) - len(total)))
    for j, n in enumerate(more):
        total[j] += n


# upper bounds of the tokens-per-round buckets (vLLM's iteration_tokens_total reports the same)
ROUND_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


@dataclass
class EngineMetrics:
    recent: deque[RoundRecord] = field(default_factory=lambda: deque(maxlen=1024))
    num_rounds: int = 0
    num_overlapped_rounds: int = 0  # rounds launched before the previous one was read back
    prefill_tokens: int = 0
    decode_tokens: int = 0
    busy_seconds: float = 0.0
    cached_tokens: int = 0  # prompt tokens served from the prompt cache
    queried_tokens: int = 0  # prompt tokens looked up in it (each request's first admission)
    num_preemptions: int = 0
    num_cancellations: int = 0
    num_failures: int = 0  # requests ended by an error in their own handling
    num_drafted: int = 0  # draft tokens verified (of ended requests)
    num_accepted: int = 0  # of them, kept
    num_verify_steps: int = 0
    # verify steps whose kept tokens came from a draft branch other than the lane's own chain
    num_branches_followed: int = 0
    # per draft position (of ended requests): drafts verified there, and kept
    drafted_at: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)
    drafter_seconds: float = 0.0  # proposing and the drafter's own prefill, within rounds
    achieved_prefill_share: float | None = None  # over rounds where both kinds of work ran
    # tokens per round, as a histogram: counts per bucket of ROUND_TOKEN_BUCKETS (the last: more)
    round_tokens: list[int] = field(default_factory=lambda: [0] * (len(ROUND_TOKEN_BUCKETS) + 1))

    @property
    def acceptance_rate(self) -> float | None:
        return self.num_accepted / self.num_drafted if self.num_drafted else None

    @property
    def mean_accepted_length(self) -> float | None:
        """Draft tokens kept per verify step (the target adds one more each step)."""
        return self.num_accepted / self.num_verify_steps if self.num_verify_steps else None

    @property
    def drafter_share(self) -> float | None:
        return self.drafter_seconds / self.busy_seconds if self.busy_seconds else None

    def add(self, record: RoundRecord) -> None:
        self.recent.append(record)
        self.num_rounds += 1
        self.num_overlapped_rounds += record.overlapped
        self.prefill_tokens += record.prefill_tokens
        self.decode_tokens += record.decode_tokens
        self.busy_seconds += record.seconds
        tokens = record.prefill_tokens + record.decode_tokens
        self.round_tokens[bisect.bisect_left(ROUND_TOKEN_BUCKETS, tokens)] += 1


def peak_memory_bytes(device: str) -> int:
    """The most memory this process has held: bytes torch allocated on a CUDA device, else the
    peak resident set (Linux reports it in KiB)."""
    if device.startswith("cuda"):
        import torch

        return int(torch.cuda.max_memory_allocated(device))
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


STATS_EVERY = 10.0  # seconds between stats lines while the engine works


@dataclass
class StatsLine:
    """A periodic one-line summary of what the engine did since the last line (the serving log's
    heartbeat): prompt and generation throughput, lanes, KV use, prompt-cache hits, drafts
    kept. Quiet while nothing happens."""

    every: float = STATS_EVERY
    _at: float | None = None
    _last: tuple[int, int, int, int, int] = (0, 0, 0, 0, 0)

    def due(self, now: float) -> bool:
        """Whether `line` has anything to decide at `now`: callers skip gathering its inputs
        (once per round) otherwise."""
        return self._at is None or now - self._at >= self.every

    def line(
        self, m: EngineMetrics, now: float, running: int, waiting: int, kv_used: float
    ) -> str | None:
        counts = (m.prefill_tokens, m.decode_tokens, m.cached_tokens, m.num_drafted, m.num_accepted)
        if self._at is None:
            self._at, self._last = now, counts
            return None
        seconds = now - self._at
        if seconds < self.every:
            return None
        prefill, decode, cached, drafted, accepted = (
            a - b for a, b in zip(counts, self._last, strict=True)
        )
        self._at, self._last = now, counts
        if not (prefill or decode or running or waiting):
            return None
        text = (
            f"prompt {prefill / seconds:.1f} tok/s, generation {decode / seconds:.1f} tok/s, "
            f"running {running}, waiting {waiting}, KV {kv_used:.0%} used"
        )
        if prefill + cached:
            text += f", prompt cache {cached / (prefill + cached):.0%} of prompt tokens"
        if drafted:
            text += f", drafts kept {accepted / drafted:.0%}"
        return text
