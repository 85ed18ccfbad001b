"""A lane: one request's slot, from admission to its last token."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lanes.cache.block_table import BlockTable

if TYPE_CHECKING:
    from lanes.detokenize import IncrementalDetokenizer
    from lanes.grammar import GrammarCursor
    from lanes.sampling import SamplingParams


class LaneState(enum.Enum):
    WAITING = "waiting"  # admitted to the queue, holds no KV
    FILL = "fill"  # prompt being computed: its blocks hold KV for num_computed tokens
    DECODE = "decode"  # generating
    DONE = "done"
    CANCELLED = "cancelled"


@dataclass(eq=False)  # a lane is itself: compared by identity
class Lane:
    request_id: int
    prompt_ids: list[int]
    params: SamplingParams  # with a concrete seed
    block_table: BlockTable
    detokenizer: IncrementalDetokenizer
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    output_top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    num_computed: int = 0  # tokens whose KV is in the lane's blocks
    state_slot: int = -1  # hybrid models: its recurrent state's slot while it runs
    # hybrid models: the key of the snapshot this lane took at its latest block boundary past
    # its prompt (only the latest is kept: a next turn repeats the whole answer)
    output_snapshot_key: bytes | None = None
    slot: int = -1  # its row in the runner's block tables while it runs
    state: LaneState = LaneState.WAITING
    finish_reason: str | None = None  # "stop" | "length" | "cancelled" | "error"
    error: str | None = None  # finish_reason "error": what failed
    text: str = ""  # output text so far (stop strings cut off)
    cache_salt: str = ""
    block_keys: list[bytes] = field(default_factory=list)  # prompt-cache keys of full blocks
    num_published: int = 0  # leading blocks already offered to the prompt cache
    cached_tokens: int = 0  # prompt tokens the first admission found in the prompt cache
    arrival_time: float = 0.0
    first_scheduled_time: float | None = None  # engine clock at its first admission
    token_times: list[float] = field(default_factory=list)  # engine clock at each output token
    # per output token: whether it was an accepted draft, and where its text ends in `text`
    output_from_draft: list[bool] = field(default_factory=list)
    output_text_ends: list[int] = field(default_factory=list)
    drafts_ahead: int = 0  # of the tokens about to be appended, how many were accepted drafts
    num_drafted: int = 0  # draft tokens the target verified
    num_accepted: int = 0  # of them, kept
    num_verify_steps: int = 0  # target steps that checked drafts
    # per draft position j (0 = the first draft of a step): drafts verified there, and kept
    drafted_at: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)
    num_sampling_steps: int = 0  # target steps that yielded tokens (drafted or not)
    acceptance_ema: float = 0.8  # running per-token acceptance, for adaptive k
    grammar_cursor: GrammarCursor | None = None  # structured outputs: the grammar's matcher
    # engine-thread time spent on (or waiting for) its grammar's masks: lanes.mask_budget
    mask_seconds: float = 0.0

    @property
    def num_known(self) -> int:
        """Tokens the lane knows: prompt plus accepted output."""
        return len(self.prompt_ids) + len(self.output_ids)

    def token_ids(self, start: int, end: int) -> list[int]:
        """Known token ids [start, end) across prompt and output."""
        p = len(self.prompt_ids)
        return (self.prompt_ids[start:end] if start < p else []) + self.output_ids[
            max(start - p, 0) : max(end - p, 0)
        ]

    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def is_finished(self) -> bool:
        return self.state in (LaneState.DONE, LaneState.CANCELLED)
