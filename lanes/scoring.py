"""Scoring: next-token logits at every position of whole prompts, all in one forward, beside the
running lanes (for prompt logprobs, distillation and the batch-invariance tests). The prompts
borrow blocks and table rows past the running lanes' own, and give them back afterwards.
"""

from __future__ import annotations

import torch

from lanes.cache.prompt_cache import PromptCache
from lanes.intake import Intake, Prompt, RequestError
from lanes.recurrent import RecurrentStates
from lanes.rounds import Step, lane_rows
from lanes.runner import ModelRunner
from lanes.sampling import SamplingParams


def score(
    prompts: list[Prompt],
    keep_features: bool,
    intake: Intake,
    cache: PromptCache,
    recurrent: RecurrentStates | None,
    runner: ModelRunner,
) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """(logits [len(prompt), vocab], features [len(prompt), hidden] or None) per prompt."""
    lanes = [intake.make_lane(p, SamplingParams(max_tokens=1)) for p in prompts]
    need = sum(lane.block_table.blocks_needed(lane.num_known) for lane in lanes)
    if need > cache.num_available:
        raise RequestError(f"scoring needs {need} KV blocks, {cache.num_available} are free")
    states = None if recurrent is None else recurrent.pool
    if states is not None and len(lanes) > states.num_free:
        raise RequestError(
            f"scoring needs {len(lanes)} recurrent-state slots, {states.num_free} are free"
        )
    for i, lane in enumerate(lanes):  # table rows past the running lanes' own
        lane.slot = intake.config.max_lanes + i
        lane.block_table.append(cache.allocate(lane.block_table.blocks_needed(lane.num_known)))
        if states is not None:
            lane.state_slot = states.allocate()
    try:
        steps = [Step(lane, 0, lane.num_known) for lane in lanes]
        logits = runner.execute(lane_rows(steps), all_logits=True)
        hidden = runner.last_hidden.clone() if keep_features else None
    finally:
        for lane in lanes:
            cache.release(lane.block_table.clear())
            if states is not None:
                states.release(lane.state_slot)
    sizes = [lane.num_known for lane in lanes]
    features = hidden.split(sizes) if keep_features else [None] * len(lanes)
    return list(zip(logits.split(sizes), features, strict=True))
