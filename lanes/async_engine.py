"""The engine on a thread of its own, for asyncio callers (the server).

Only the engine thread runs rounds. Callers never wait for a round to end:
- `submit` validates and tokenizes on a worker thread (Engine.make_lane reads only what never
  changes), gets its request id at once, and queues the lane; the engine thread takes it in
  between two rounds.
- `cancel` / `cancel_all` set flags the engine reads between two host-managed forwards.
- `snapshot()` returns the state the engine thread last published (between forwards, after
  rounds, and when idle), so /metrics and /debug/kv answer at once during a long prefill.

Each request's progress comes back as events on that request's asyncio queue:

    Delta(...)* -> Finished(completion)   or   Delta(...)* -> Failed(error)   or   ... Aborted()

`Aborted` comes from `cancel_all` (shutdown) at once, so every stream can end without waiting for
the forward in progress (on the CPU one prefill forward can take seconds); the engine cancels
the lane at its next step all the same.

The loop survives anything one request does: the engine keeps failures to the lanes they concern
(Engine.step), a round that raises anyway fails the lanes in flight, and if the thread dies all
the same, `alive` turns False (the server's /health says 503) and every waiting caller is failed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lanes.cache.block_pool import IntegrityError
from lanes.engine import Completion, Engine, Prompt
from lanes.lane import Lane
from lanes.metrics import StatsLine, peak_memory_bytes
from lanes.sampling import SamplingParams

log = logging.getLogger("lanes")

# While rounds run, the snapshot is refreshed at most this often (and whenever lanes come or go),
# the block-integrity check (it walks every block) less often still; both always when idle.
_SNAPSHOT_EVERY_S = 0.05
_INTEGRITY_EVERY_S = 0.5


@dataclass(frozen=True)
class Delta:
    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]]
    text: str
    # per token: an accepted draft or not, and where its text ends in the output (lanes.draft_spans)
    from_draft: list[bool] = field(default_factory=list)
    text_ends: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Finished:
    completion: Completion


@dataclass(frozen=True)
class Failed:
    error: Exception


@dataclass(frozen=True)
class Aborted:
    """The server is shutting down: the request ends now, unfinished."""


class EngineFailure(RuntimeError):
    """The engine could not finish a request (not the request's fault, as far as it knows)."""


class ShuttingDown(RuntimeError):
    """The server is stopping and takes no new requests."""


@dataclass
class _Tracked:
    lane: Lane
    post: Callable[[Any], None]
    sent_tokens: int = 0
    sent_text: int = 0
    hold: int = field(default=0)  # characters held back: a stop string may still cut them


class RequestHandle:
    def __init__(self, owner: AsyncEngine, lane: Lane, events: asyncio.Queue) -> None:
        self._owner = owner
        self._events = events
        self.request_id = lane.request_id
        self.prompt_ids = lane.prompt_ids

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    async def next_event(self) -> Any:
        return await self._events.get()

    def cancel(self) -> None:
        self._owner.cancel(self.request_id)


class AsyncEngine:
    def __init__(self, engine: Engine, log_stats: bool = True) -> None:
        self.engine = engine
        self.log_stats = log_stats  # a periodic stats line (vLLM's --disable-log-stats: off)
        self._commands: queue.Queue = queue.Queue()
        self._cancelled: set[int] = set()
        self._cancel_everything = False
        self._cancel_lock = threading.Lock()
        self._tracked: dict[int, _Tracked] = {}
        self._thread = threading.Thread(target=self._run, name="lanes-engine", daemon=True)
        self._stopping = False
        self._crashed = False
        self._snapshot: dict = {}
        self._integrity_at = self._snapshot_at = 0.0
        self._lanes = (0, 0)  # (running, waiting) at the last snapshot
        self._num_queued = 0  # lanes submitted, not yet handed to the engine
        self._open: dict[int, Callable[[Any], None]] = {}  # request id -> post, until it ends
        self._stats = StatsLine()
        engine.cancel_check = self._is_cancelled
        engine.on_progress = lambda: self._publish_snapshot(check=False)

    # ---- caller side (event loop thread) --------------------------------------------------

    def start(self) -> None:
        self._publish_snapshot(check=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        """The engine thread is running rounds (False before start, after stop or a crash)."""
        return self._thread.is_alive() and not self._crashed and not self._stopping

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel every request and stop the engine thread."""
        self.cancel_all()
        self._commands.put(("stop",))
        self._thread.join(timeout)

    def make_lanes(self, prompts: list[tuple[Prompt, SamplingParams, str]]) -> list[Lane]:
        """Validate and tokenize requests (any thread; raises RequestError for bad input)."""
        return [self.engine.make_lane(p, params, salt) for p, params, salt in prompts]

    async def call(self, fn: Callable[[Engine], Any]) -> Any:
        """fn(engine) on the engine thread, between two rounds (prompt scoring): its result, or
        its exception raised here."""
        if not self.alive:
            raise ShuttingDown("the server is shutting down" if self._stopping else "engine down")
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._commands.put(("call", fn, future))
        if self._crashed:  # died after the check above: nobody would run it
            with contextlib.suppress(concurrent.futures.InvalidStateError):
                future.set_exception(EngineFailure("the engine stopped"))
        return await asyncio.wrap_future(future)

    def submit_lanes(self, lanes: list[Lane]) -> list[RequestHandle]:
        """Queue lanes made by make_lanes, all at once; on the event loop's thread."""
        if not self.alive:
            raise ShuttingDown("the server is shutting down" if self._stopping else "engine down")
        loop = asyncio.get_running_loop()
        handles, queued = [], []
        for lane in lanes:
            events: asyncio.Queue = asyncio.Queue()

            def post(event: Any, events: asyncio.Queue = events) -> None:
                loop.call_soon_threadsafe(events.put_nowait, event)

            handles.append(RequestHandle(self, lane, events))
            queued.append((lane, post))
        with self._cancel_lock:
            self._num_queued += len(queued)
            self._open.update((lane.request_id, post) for lane, post in queued)
        self._commands.put(("submit", queued))
        if self._crashed:  # died after the check above: nobody would answer these
            self._fail_everything(EngineFailure("the engine stopped"))
        return handles

    async def submit(
        self, prompt: Prompt, params: SamplingParams, cache_salt: str = ""
    ) -> RequestHandle:
        """Validate and queue one request; raises RequestError (bad input) before any output."""
        lanes = await asyncio.to_thread(self.make_lanes, [(prompt, params, cache_salt)])
        return self.submit_lanes(lanes)[0]

    def snapshot(self) -> dict:
        """Block bookkeeping and engine counters as the engine thread last published them; lanes
        submitted since, not yet handed to the engine, count as waiting."""
        report = dict(self._snapshot)
        report["waiting_lanes"] = report.get("waiting_lanes", 0) + self._num_queued
        return report

    def cancel(self, request_id: int) -> None:
        """Cancel a request still open (a no-op for one that ended: nothing to remember)."""
        with self._cancel_lock:
            if request_id in self._open:
                self._cancelled.add(request_id)

    def cancel_all(self) -> None:
        """Cancel every request in flight (shutdown); safe from any thread. Each request gets
        `Aborted` now; the engine ends the lanes between two forwards."""
        self._cancel_everything = True
        with self._cancel_lock:
            posts, self._open = list(self._open.values()), {}
        for post in posts:
            post(Aborted())

    # ---- engine thread --------------------------------------------------------------------

    def _is_cancelled(self, request_id: int) -> bool:
        if self._cancel_everything:
            return True
        with self._cancel_lock:
            return request_id in self._cancelled

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as e:  # a bug in the loop itself: say so everywhere, hang nowhere
            self._crashed = True
            log.exception("the engine thread stopped")
            self._fail_everything(EngineFailure(f"the engine stopped: {type(e).__name__}"))

    def _loop(self) -> None:
        dirty = False
        while True:
            idle = not self.engine.has_work()
            if idle and dirty:
                self._publish_snapshot(check=True)
                dirty = False
            try:
                command = self._commands.get(timeout=0.05) if idle else self._commands.get_nowait()
            except queue.Empty:
                command = None
            if command is not None:
                self._execute(command)
                dirty = True
                continue  # drain every waiting command before the next round
            if self._stopping:
                self._publish_snapshot(check=True)
                return
            if not idle:
                self._round()
                self._publish_snapshot(check=False)
                dirty = True
            self._log_stats()

    def _log_stats(self) -> None:
        e, now = self.engine, self.engine.clock()
        if not self.log_stats or not self._stats.due(now):
            return
        used = 1.0 - e.cache.num_available / max(1, e.pool.num_blocks)
        line = self._stats.line(e.metrics, now, len(e.running), len(e.waiting), used)
        if line is not None:
            log.info("%s", line)

    def _execute(self, command: tuple) -> None:
        kind = command[0]
        if kind == "submit":  # during shutdown too: the cancel flag ends them as aborted
            with self._cancel_lock:
                self._num_queued -= len(command[1])
            for lane, post in command[1]:
                hold = max((len(s) for s in lane.params.stop), default=1) - 1
                self._tracked[lane.request_id] = _Tracked(lane, post, hold=hold)
                self.engine.enqueue(lane)
        elif kind == "call":
            fn, future = command[1], command[2]
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(self.engine))
                except Exception as e:  # the caller's request fails, not the engine
                    future.set_exception(e)
        elif kind == "stop":
            self._stopping = True
            self._cancel_everything = True
            while self.engine.has_work():
                self._round()
            self._drain_calls(ShuttingDown("the server is shutting down"))

    def _drain_calls(self, error: Exception) -> None:
        """Commands queued behind a stop (or a dead engine thread): nobody will run them, so they
        fail (never hang)."""
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if command[0] == "submit":
                for _, post in command[1]:
                    post(Failed(error))
            elif command[0] == "call":
                with contextlib.suppress(concurrent.futures.InvalidStateError):
                    command[2].set_exception(error)

    def _round(self) -> None:
        try:
            ended = self.engine.step()
        except Exception as e:  # the engine's own boundaries missed it: fail the lanes in flight
            log.exception("engine round failed")
            ended = []
            for rid, t in list(self._tracked.items()):
                t.post(Failed(EngineFailure(f"the engine round failed: {type(e).__name__}")))
                del self._tracked[rid]
                self.cancel(rid)
        for t in self._tracked.values():
            self._send_progress(t, final=False)
        for completion in ended:
            t = self._tracked.pop(completion.request_id, None)
            with self._cancel_lock:
                self._cancelled.discard(completion.request_id)
                self._open.pop(completion.request_id, None)
            if t is None:
                continue
            if completion.finish_reason == "error":
                error = f"request {completion.request_id} failed in the engine ({completion.error})"
                t.post(Failed(EngineFailure(error)))
                continue
            self._send_progress(t, final=True, text=completion.text)
            t.post(Finished(completion))

    def _fail_everything(self, error: Exception) -> None:
        for t in self._tracked.values():
            t.post(Failed(error))
        self._tracked.clear()
        self._drain_calls(error)

    def _publish_snapshot(self, check: bool) -> None:
        """Publish what /metrics and /debug/kv read; the integrity check at most every
        _INTEGRITY_EVERY_S while rounds run, and always when `check` (idle)."""
        now = time.monotonic()
        lanes = (len(self.engine.running), len(self.engine.waiting))
        if not check and now - self._snapshot_at < _SNAPSHOT_EVERY_S and lanes == self._lanes:
            return
        self._snapshot_at, self._lanes = now, lanes
        previous = self._snapshot.get("integrity", "ok")
        if check or now - self._integrity_at >= _INTEGRITY_EVERY_S:
            self._integrity_at = now
            try:
                self.engine.check_integrity()
                previous = "ok"
            except IntegrityError as e:
                previous = str(e)
        self._snapshot = engine_report(self.engine, previous)

    @staticmethod
    def _send_progress(t: _Tracked, final: bool, text: str | None = None) -> None:
        lane = t.lane
        n = len(lane.output_ids)
        text = lane.text if text is None else text
        ready = len(text) if final else max(t.sent_text, len(text) - t.hold)
        if n == t.sent_tokens and ready == t.sent_text:
            return
        top = lane.output_top_logprobs[t.sent_tokens : n] if lane.params.top_logprobs else []
        delta = Delta(
            token_ids=lane.output_ids[t.sent_tokens : n],
            logprobs=lane.output_logprobs[t.sent_tokens : n],
            top_logprobs=top,
            text=text[t.sent_text : ready],
            from_draft=lane.output_from_draft[t.sent_tokens : n],
            text_ends=lane.output_text_ends[t.sent_tokens : n],
        )
        t.sent_tokens, t.sent_text = n, ready
        t.post(delta)


def engine_report(engine: Engine, integrity: str) -> dict:
    """Block bookkeeping and counters, computed on the engine thread between rounds."""
    owned = {b for lane in engine.running for b in lane.block_table.blocks}
    m = engine.metrics
    return {
        "blocks_total": engine.pool.num_blocks,
        "blocks_free": engine.pool.num_free,
        "blocks_cached": engine.cache.num_cached,
        "blocks_owned_by_lanes": len(owned),
        "active_lanes": len(engine.running),
        "waiting_lanes": len(engine.waiting),
        "integrity": integrity,
        "draft_acceptance_rate": m.acceptance_rate,
        "prefill_share": m.achieved_prefill_share,
        "prompt_cache_bytes": engine.cache.num_cached * engine.bytes_per_block,
        "peak_memory_bytes": peak_memory_bytes(engine.config.device),
        "failed_requests": m.num_failures,
        "rounds": m.num_rounds,
        "preemptions": m.num_preemptions,
        "prefix_cache_queried_tokens": m.queried_tokens,
        "prefix_cache_hit_tokens": m.cached_tokens,
        "verify_steps": m.num_verify_steps,
        "draft_tokens": m.num_drafted,
        "accepted_draft_tokens": m.num_accepted,
        "drafted_at": list(m.drafted_at),
        "accepted_at": list(m.accepted_at),
        "round_tokens": list(m.round_tokens),  # a histogram: counts per ROUND_TOKEN_BUCKETS
        "round_tokens_sum": m.prefill_tokens + m.decode_tokens,
        **_recurrent_report(engine),
    }


def _recurrent_report(engine: Engine) -> dict:
    """Hybrid models: the recurrent-state slots and snapshots beside the KV."""
    if engine.recurrent is None:
        return {}
    pool, snaps = engine.recurrent.pool, engine.recurrent.snapshots
    return {
        "state_slots_capacity": pool.num_slots,
        "state_slots_used": pool.num_slots - pool.num_free,
        "state_bytes": pool.nbytes,
        "state_snapshots": len(snaps),
        "state_snapshot_bytes": snaps.nbytes,
    }
