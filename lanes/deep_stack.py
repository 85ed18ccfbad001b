"""Threads with a large stack, for native code that recurses as deep as its input (llguidance
building a grammar's matcher): an input that would overflow a default 8 MiB stack, and kill the
process with it, fits in one of these. The stack is address space, touched only as deep as a call
goes, so a large one costs memory only while something recurses that far."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import Future
from typing import TypeVar

T = TypeVar("T")

STACK_BYTES = 512 * 2**20
FALLBACK_STACK_BYTES = 64 * 2**20  # still 8x a default thread's


class DeepStackThreads:
    """A fixed set of daemon threads, each with a STACK_BYTES stack, running submitted calls in
    order. `run` waits at most `timeout` seconds; a call that takes longer goes on in its thread
    (native code cannot be interrupted) and its result is dropped."""

    def __init__(self, num_threads: int, name: str, stack_bytes: int = STACK_BYTES) -> None:
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self.stack_bytes = 0
        for size in (stack_bytes, FALLBACK_STACK_BYTES):  # where address space is rationed
            try:
                self._start(num_threads, name, size)
                self.stack_bytes = size
                break
            except (RuntimeError, ValueError, MemoryError):  # "can't start new thread"
                continue
        if not self.stack_bytes:
            raise RuntimeError(
                f"could not start {name} threads with a {FALLBACK_STACK_BYTES} stack"
            )

    def _start(self, num_threads: int, name: str, stack_bytes: int) -> None:
        # threading.stack_size is process-wide for threads started after it: set, start, restore
        with _STACK_SIZE_LOCK:
            previous = threading.stack_size(stack_bytes)
            try:
                for i in range(num_threads):
                    threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True).start()
            finally:
                threading.stack_size(previous)

    def run(self, call: Callable[[], T], timeout: float) -> T:
        """call() on one of the threads; its result or exception, or TimeoutError."""
        try:
            return self.submit(call).result(timeout)
        except futures.TimeoutError as e:  # the builtin one from Python 3.11, not before
            raise TimeoutError(f"over {timeout:g} s") from e

    def submit(self, call: Callable[[], T]) -> Future:
        """call() on one of the threads, when one is free: its future."""
        future: Future = Future()
        self._calls.put((call, future))
        return future

    def _work(self) -> None:
        while True:
            call, future = self._calls.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(call())
            except BaseException as e:  # handed to the caller, whatever it is
                future.set_exception(e)


_STACK_SIZE_LOCK = threading.Lock()
