"""lanes/mask_prefetch.py: each step's first grammar mask is computed on a helper thread while
the forward runs, and the engine takes it from there, while drafted output still equals
undrafted, token for token and logprob for logprob, with drafts rejected. Control: prefetch
off, every mask is computed on the engine thread, same outputs."""

from __future__ import annotations

import threading

import pytest

from lanes import EngineConfig, SamplingParams, build_engine
from lanes.grammar import Grammar, GrammarCursor
from lanes.mask_prefetch import MaskPrefetch
from tests.replay_drafts import drafted_and_plain
from tests.test_grammar import PROMPTS, SCHEMA


def _count_threads(monkeypatch) -> dict[str, int]:
    """Calls of GrammarCursor.allowed by thread name."""
    calls: dict[str, int] = {}
    real = GrammarCursor.allowed

    def counted(self, output_ids):
        name = "masks" if threading.current_thread().name.startswith("lanes-masks") else "other"
        calls[name] = calls.get(name, 0) + 1
        return real(self, output_ids)

    monkeypatch.setattr(GrammarCursor, "allowed", counted)
    return calls


@pytest.mark.parametrize("prefetch", [True, False])
def test_masks_come_from_the_helper_and_drafted_equals_undrafted(
    tiny_models, monkeypatch, prefetch
):
    path, _ = tiny_models["llama"]
    cfg = EngineConfig(num_draft_tokens=4, adaptive_drafts=False, prefetch_masks=prefetch)
    engine = build_engine(str(path), cfg)  # prefetch False, the control: every mask computed
    # on the engine's thread, as before (and the CPU's default)
    calls = _count_threads(monkeypatch)
    params = SamplingParams(max_tokens=60, grammar=Grammar.json_schema(SCHEMA))
    drafted, plain = drafted_and_plain(engine, PROMPTS, params)
    assert sum(d.num_drafted - d.num_accepted for d in drafted) > 0  # some drafts rejected
    for d, p in zip(drafted, plain, strict=True):
        assert (d.token_ids, d.logprobs) == (p.token_ids, p.logprobs)
    on_helper = calls.get("masks", 0)
    elsewhere = sum(n for name, n in calls.items() if name != "masks")
    if prefetch:  # each step's first row on the helper; rows behind drafts as they are needed
        assert on_helper > 0, calls
    else:
        assert on_helper == 0 and elsewhere > 0, calls


def test_a_row_the_engine_asks_for_that_was_not_prefetched_is_computed(tiny_models):
    path, _ = tiny_models["llama"]
    engine = build_engine(str(path))
    lane = engine.submit("hi", SamplingParams(max_tokens=4, grammar=Grammar("regex", "[a-c]+")))
    prefetch = MaskPrefetch()
    direct = engine.grammars.cursor(lane.params.grammar).allowed([])
    assert bool((prefetch.allowed(lane, []) == direct).all())
    assert lane.mask_seconds > 0
