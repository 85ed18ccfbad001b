"""Draft spans: which characters of an output came from accepted drafts (lanes/draft_spans.py),
marked per token by the engine and cut into runs by character position."""

from __future__ import annotations

from lanes import EngineConfig, SamplingParams, build_engine
from lanes.draft_spans import StreamedSpans, draft_spans
from lanes.drafter.replay import ReplayProposer

REPEATS = "one two three four five one two three four five one two three four five"


def test_runs_follow_the_tokens_text_ends():
    # tokens "ab" (target), "c" (draft), "" (draft, no text yet), "de" (draft), "f" (target)
    ends, drafted = [2, 3, 3, 5, 6], [False, True, True, True, False]
    assert draft_spans("abcdef", 0, ends, drafted) == [["ab", False], ["cde", True], ["f", False]]
    assert draft_spans("cd", 2, ends, drafted) == [["cd", True]]
    # characters past every token's end (the detokenizer's final flush) are the last token's
    assert draft_spans("fgh", 5, ends, drafted) == [["fgh", False]]
    assert draft_spans("", 3, ends, drafted) == []


def test_a_stream_held_back_gets_the_runs_of_the_whole():
    ends, drafted = [2, 3, 5, 6], [False, True, True, False]
    whole = draft_spans("abcdef", 0, ends, drafted)
    streamed = StreamedSpans()
    # the text lags its tokens (held back for a stop string), then catches up
    pieces = [
        streamed.feed("a", ends[:2], drafted[:2]),
        streamed.feed("bcd", ends[2:3], drafted[2:3]),
        streamed.feed("ef", ends[3:], drafted[3:]),
    ]
    merged: list = []
    for text, d in (span for piece in pieces for span in piece):
        if merged and merged[-1][1] == d:
            merged[-1][0] += text
        else:
            merged.append([text, d])
    assert merged == whole


def test_the_engine_marks_exactly_its_accepted_drafts(long_model_dir):
    engine = build_engine(str(long_model_dir), EngineConfig(prefill_chunk=16))
    ids = engine.encode(REPEATS)
    greedy = SamplingParams(max_tokens=40, ignore_eos=True)
    (plain,) = engine.generate([ids], greedy)
    assert plain.from_draft == [False] * 40  # no drafter: nothing is a draft
    vocab = engine.model_config.vocab_size
    engine.proposer = ReplayProposer({tuple(ids): plain.token_ids}, 0.7, vocab)
    (drafted,) = engine.generate([ids], greedy)
    assert drafted.token_ids == plain.token_ids
    assert 0 < sum(drafted.from_draft) == drafted.num_accepted < 40
    assert len(drafted.text_ends) == 40 and drafted.text_ends[-1] <= len(drafted.text)
    assert drafted.text_ends == sorted(drafted.text_ends)
    # the first token comes from the prompt's forward: the target's own
    assert not drafted.from_draft[0]
