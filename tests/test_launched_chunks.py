"""Prompt chunks without full synchronizes (lanes/launched_chunks.py): one chunk forward stays
queued behind the running one, and a chunk counts as computed (what the prompt cache may be
offered) only once its forward's event has completed. On the CPU with events that complete only
when waited for, as a CUDA stream's would if the device were slow. With a negative control."""

from __future__ import annotations

import random

from lanes import EngineConfig, SamplingParams, build_engine
from lanes.launched_chunks import LaunchedChunks

BS = 16
PROMPT = [random.Random(3).randrange(3, 380) for _ in range(8 * BS + 5)]
GREEDY = SamplingParams(max_tokens=8, ignore_eos=True)


class SlowEvent:
    """Completes only when the host waits for it (as if the device had not got there yet)."""

    def __init__(self) -> None:
        self.recorded = self.completed = False

    def record(self) -> None:
        self.recorded = True

    def synchronize(self) -> None:
        assert self.recorded
        self.completed = True


class Recording(LaunchedChunks):
    """LaunchedChunks that remembers which positions each event covers."""

    def __init__(self) -> None:
        super().__init__(SlowEvent)
        self.log: list[tuple[list, SlowEvent]] = []

    def launched(self, ends) -> None:
        super().launched(ends)
        if ends:
            self.log.append((list(ends), self._queue[-1][1]))

    def completed_end(self, lane) -> int:
        return max(
            (end for ends, ev in self.log if ev.completed for x, end in ends if x is lane),
            default=0,
        )


class CountedAtLaunch(Recording):
    """The bug class: positions counted as computed when their forward is launched."""

    def launched(self, ends) -> None:
        for lane, end in ends:
            lane.num_computed = max(lane.num_computed, end)
        super().launched(ends)


def _engine(llama_dir, chunks: Recording):
    engine = build_engine(str(llama_dir), EngineConfig(block_size=BS, prefill_chunk=BS))
    engine.scheduler.chunks = engine.execution.chunks = chunks
    return engine


def _run(engine, salt: str, cancel_after_blocks: int | None = None):
    """Run PROMPT; at every point where a cancel can land, record (num_computed, positions whose
    forwards completed, chunks queued) of the filling lane; cancel after that many blocks."""
    chunks = engine.execution.chunks
    seen = []
    rid = engine.add_request(PROMPT, GREEDY, cache_salt=salt)

    def check(request_id: int) -> bool:
        lane = next((x for x in engine.running if x.request_id == request_id), None)
        if lane is None or lane.output_ids:
            return False
        seen.append((lane.num_computed, chunks.completed_end(lane), len(chunks)))
        return cancel_after_blocks is not None and lane.num_computed >= cancel_after_blocks * BS

    engine.cancel_check = check
    try:
        while True:
            for c in engine.step():
                if c.request_id == rid:
                    engine.check_integrity()
                    return c, seen
    finally:
        engine.cancel_check = None


def test_one_chunk_stays_queued_and_only_completed_chunks_count(llama_dir):
    engine = _engine(llama_dir, Recording())
    out, seen = _run(engine, "a")
    assert out.finish_reason == "length"
    assert all(computed <= done for computed, done, _ in seen)  # nothing counted early
    assert all(queued <= 1 for _, _, queued in seen)  # the host waits for all but one
    assert any(queued == 1 for _, _, queued in seen)  # ... and does not wait for that one


def test_cancel_keeps_the_chunk_in_flight_and_resumes_exactly(llama_dir):
    engine = _engine(llama_dir, Recording())
    cancelled, seen = _run(engine, "b", cancel_after_blocks=3)
    assert cancelled.finish_reason == "cancelled"
    computed, _, queued = seen[-1]
    assert computed == 3 * BS and queued == 1  # block 4's forward was in flight at the cancel
    retry, _ = _run(engine, "b")
    assert retry.cached_tokens == 4 * BS  # the cancel waited for it, and kept it
    fresh, _ = _run(engine, "fresh")
    assert fresh.cached_tokens == 0
    assert (retry.token_ids, retry.logprobs) == (fresh.token_ids, fresh.logprobs)


def test_negative_control_counting_at_launch_is_caught(llama_dir):
    """Counting a chunk when it is launched breaks the check above."""
    engine = _engine(llama_dir, CountedAtLaunch())
    _, seen = _run(engine, "c")
    assert any(computed > done for computed, done, _ in seen)
