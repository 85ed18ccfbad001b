"""uvicorn's h11 protocol with a deadline for each request's headers, and Nagle's algorithm off.

uvicorn arms no timer until a first response is sent, and its keep-alive timer is disarmed by
any byte received, so a client that opens connections and sends headers a byte at a time (or
half of them, then nothing) holds them open for ever: 300 such connections stayed open in the
audit of issue 39. Here a connection whose next request's headers are not complete within
`header_timeout` seconds of the connection opening (or of the last response ending) is closed.
The body has its own deadline (lanes.server.BODY_TIMEOUT_S).

Each connection also gets TCP_NODELAY. asyncio sets it only where the listening socket was made
with proto IPPROTO_TCP, and `lanes serve` binds its port itself (before loading the model) with
proto 0. So a response went out as two writes, headers then body. The body waited for the
client's delayed ACK of the headers, ~40 ms on Linux: vllm-router's requests to a replica (its
render call, then the completion) each took 40 ms more. curl ACKs at once, so it never saw this."""

from __future__ import annotations

import asyncio
import contextlib
import socket

from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_TIMEOUT_S = 30.0


class HeaderDeadlineH11(H11Protocol):
    header_timeout = HEADER_TIMEOUT_S

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._header_deadline: asyncio.TimerHandle | None = None
        no_nagle(transport)
        super().connection_made(transport)
        self._arm_header_deadline()

    def on_response_complete(self) -> None:
        self._arm_header_deadline()  # the next request on this connection (armed first: a
        super().on_response_complete()  # pipelined one handled here disarms it at once)

    def handle_events(self) -> None:
        waiting_for = self._waiting_cycle
        super().handle_events()
        if self.cycle is not waiting_for:  # a new request's headers arrived
            self._disarm_header_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_deadline()
        super().connection_lost(exc)

    def _arm_header_deadline(self) -> None:
        self._disarm_header_deadline()
        self._waiting_cycle = self.cycle
        self._header_deadline = self.loop.call_later(self.header_timeout, self._headers_late)

    def _disarm_header_deadline(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _headers_late(self) -> None:
        self._header_deadline = None
        if self.cycle is self._waiting_cycle and not self.transport.is_closing():
            self.transport.close()


def no_nagle(transport: asyncio.BaseTransport) -> None:
    """TCP_NODELAY on the connection's socket (TCP only; anything else is left as it is)."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):  # closed already
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
