"""Shared by the logits-processing tests (penalties, grammars): drafted against undrafted output
with replayed drafts, and the negative control's engine."""

from __future__ import annotations

import dataclasses

from lanes.drafter.replay import ReplayProposer
from lanes.engine import Engine

# The replayed drafts' noise is keyed by the request's seed; a greedy request without one gets a
# fresh seed per run, so which drafts are right (and whether a negative control's broken
# mechanism is ever reached) changed from run to run: a CI run's control found no difference.
REPLAY_SEED = 2


def drafted_and_plain(engine: Engine, prompts: list[str], params):
    """(drafted, plain) completions: plain with draft=False; drafted with the plain output
    replayed as drafts at acceptance 0.6 (random tokens otherwise). A request without a seed
    gets REPLAY_SEED, which greedy output does not read: the same drafts every run."""
    if params.seed is None:
        params = dataclasses.replace(params, seed=REPLAY_SEED)
    plain = engine.generate(prompts, dataclasses.replace(params, draft=False))
    records = {tuple(engine.encode(p)): c.token_ids for p, c in zip(prompts, plain, strict=True)}
    engine.proposer = ReplayProposer(records, 0.6, engine.model_config.vocab_size)
    return engine.generate(prompts, params, cache_salt="drafted"), plain


class NoDraftsInHistory(Engine):
    """Negative control: verify rows are processed (penalties, grammar masks) as if the drafts
    before them were not output."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.verifier.row_history = lambda s, j: list(s.lane.output_ids)


def drafted_equals_replayed(engine: Engine, prompts: list, outputs: list, params) -> None:
    """The engine drafting `outputs` back (acceptance 0.5, a wrong token otherwise) gives those
    outputs bitwise, some drafts rejected, and its bookkeeping intact."""
    records = {tuple(engine.encode(p)): o.token_ids for p, o in zip(prompts, outputs, strict=True)}
    engine.proposer = ReplayProposer(records, 0.5, engine.model_config.vocab_size)
    drafted = engine.generate(prompts, params, cache_salt="drafted")
    assert sum(d.num_drafted - d.num_accepted for d in drafted) > 0
    for d, o in zip(drafted, outputs, strict=True):
        assert (d.token_ids, d.logprobs) == (o.token_ids, o.logprobs)
    engine.check_integrity()
