"""The engine on a thread of its own, for asyncio callers (the server).

Only the engine thread touches the Engine. Callers send commands through a queue; each request's
progress comes back as events on that request's asyncio queue:

    Accepted(prompt_len) -> Delta(...)* -> Finished(completion)      or   Failed(error)

Cancelling (`RequestHandle.cancel`, e.g. on client disconnect) is seen by the engine between two
host-managed forwards, through Engine.cancel_check.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lanes.engine import Completion, Engine, Prompt, RequestError
from lanes.lane import Lane
from lanes.sampling import SamplingParams

log = logging.getLogger("lanes")


@dataclass(frozen=True)
class Accepted:
    request_id: int
    prompt_len: int


@dataclass(frozen=True)
class Delta:
    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]]
    text: str


@dataclass(frozen=True)
class Finished:
    completion: Completion


@dataclass(frozen=True)
class Failed:
    error: Exception


@dataclass
class _Tracked:
    lane: Lane
    post: Callable[[Any], None]
    sent_tokens: int = 0
    sent_text: int = 0
    hold: int = field(default=0)  # characters held back: a stop string may still cut them


class RequestHandle:
    def __init__(self, owner: AsyncEngine, events: asyncio.Queue) -> None:
        self._owner = owner
        self._events = events
        self.request_id: int | None = None
        self.prompt_len = 0

    async def next_event(self) -> Any:
        return await self._events.get()

    def cancel(self) -> None:
        if self.request_id is not None:
            self._owner.cancel(self.request_id)


class AsyncEngine:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._commands: queue.Queue = queue.Queue()
        self._cancelled: set[int] = set()
        self._cancel_lock = threading.Lock()
        self._tracked: dict[int, _Tracked] = {}
        self._thread = threading.Thread(target=self._run, name="lanes-engine", daemon=True)
        self._stopping = False
        engine.cancel_check = self._is_cancelled

    # ---- caller side (event loop thread) --------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel every request and stop the engine thread."""
        self._commands.put(("stop",))
        self._thread.join(timeout)

    async def submit(
        self, prompt: Prompt, params: SamplingParams, cache_salt: str = ""
    ) -> RequestHandle:
        """Queue a request; raises RequestError (bad input) before any output is produced."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        handle = RequestHandle(self, events)

        def post(event: Any) -> None:
            loop.call_soon_threadsafe(events.put_nowait, event)

        self._commands.put(("submit", prompt, params, cache_salt, post))
        first = await events.get()
        if isinstance(first, Failed):
            raise first.error
        handle.request_id, handle.prompt_len = first.request_id, first.prompt_len
        return handle

    async def call(self, fn: Callable[[Engine], Any]) -> Any:
        """Run fn(engine) on the engine thread between rounds; return its result."""
        future = asyncio.get_running_loop().create_future()
        loop = future.get_loop()

        def done(result: Any, error: BaseException | None) -> None:
            if not future.done():
                future.set_exception(error) if error else future.set_result(result)

        self._commands.put(("call", fn, lambda r, e: loop.call_soon_threadsafe(done, r, e)))
        return await future

    def cancel(self, request_id: int) -> None:
        with self._cancel_lock:
            self._cancelled.add(request_id)

    def cancel_all(self) -> None:
        """Cancel every request in flight (shutdown); safe from any thread."""
        self._commands.put(("cancel_all",))

    # ---- engine thread --------------------------------------------------------------------

    def _is_cancelled(self, request_id: int) -> bool:
        with self._cancel_lock:
            return request_id in self._cancelled

    def _run(self) -> None:
        while True:
            idle = not self.engine.has_work()
            try:
                command = self._commands.get(timeout=0.05) if idle else self._commands.get_nowait()
            except queue.Empty:
                command = None
            if command is not None:
                self._execute(command)
                continue  # drain every waiting command before the next round
            if self._stopping:
                return
            if not idle:
                self._round()

    def _execute(self, command: tuple) -> None:
        kind = command[0]
        if kind == "submit":
            _, prompt, params, salt, post = command
            try:
                lane = self.engine.submit(prompt, params, salt)
            except (RequestError, ValueError) as e:
                post(Failed(e))
                return
            hold = max((len(s) for s in params.stop), default=1) - 1
            self._tracked[lane.request_id] = _Tracked(lane, post, hold=hold)
            post(Accepted(lane.request_id, len(lane.prompt_ids)))
        elif kind == "call":
            _, fn, reply = command
            try:
                reply(fn(self.engine), None)
            except Exception as e:  # the caller gets it; the engine keeps serving
                reply(None, e)
        elif kind == "cancel_all":
            for rid in self._tracked:
                self.cancel(rid)
        elif kind == "stop":
            self._stopping = True
            self._execute(("cancel_all",))
            while self.engine.has_work():
                self._round()

    def _round(self) -> None:
        try:
            ended = self.engine.step()
        except Exception as e:  # a bug, not bad input: fail the lanes in flight, keep serving
            log.exception("engine round failed")
            ended = []
            for rid, t in list(self._tracked.items()):
                t.post(Failed(e))
                del self._tracked[rid]
                self.cancel(rid)
        for t in self._tracked.values():
            self._send_progress(t, final=False)
        for completion in ended:
            t = self._tracked.pop(completion.request_id, None)
            with self._cancel_lock:
                self._cancelled.discard(completion.request_id)
            if t is not None:
                self._send_progress(t, final=True, text=completion.text)
                t.post(Finished(completion))

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
        )
        t.sent_tokens, t.sent_text = n, ready
        t.post(delta)
