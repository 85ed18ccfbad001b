"""Shared by the logits-processing tests (penalties, grammars): drafted against undrafted output
with replayed drafts, and the negative control's engine."""

from __future__ import annotations

import dataclasses

from lanes.drafter.replay import ReplayProposer
from lanes.engine import Engine


def drafted_and_plain(engine: Engine, prompts: list[str], params):
    """(drafted, plain) completions: plain with draft=False; drafted with the plain output
    replayed as drafts at acceptance 0.6 (random tokens otherwise)."""
    plain = engine.generate(prompts, dataclasses.replace(params, draft=False))
    records = {tuple(engine.encode(p)): c.token_ids for p, c in zip(prompts, plain, strict=True)}
    engine.proposer = ReplayProposer(records, 0.6, engine.model_config.vocab_size)
    return engine.generate(prompts, params, cache_salt="drafted"), plain


class NoDraftsInHistory(Engine):
    """Negative control: verify rows are processed (penalties, grammar masks) as if the drafts
    before them were not output."""

    @staticmethod
    def _row_history(s, j):
        return list(s.lane.output_ids)
