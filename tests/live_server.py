"""A live lanes server for tests: uvicorn on a free loopback port, in a thread of this process."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import threading
import time
import urllib.request

import openai
import uvicorn

from lanes import Engine
from lanes.server import build_app

MODEL = "tiny"


class LiveServer:
    """uvicorn on a free loopback port, in a thread of this process."""

    def __init__(self, engine: Engine, api_key: str | None = None, **options) -> None:
        self.engine = engine
        names = options.pop("names", MODEL)
        self.app = build_app(engine, names, api_key=api_key, **options)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning"))
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            if time.time() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(30)

    def client(self, **kw) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=self.url + "/v1", api_key=kw.pop("api_key", "none"), max_retries=0, **kw
        )

    def async_client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.url + "/v1", api_key="none", max_retries=0)

    def get(self, path: str) -> str:
        with urllib.request.urlopen(self.url + path, timeout=30) as r:
            return r.read().decode()

    def kv(self) -> dict:
        return json.loads(self.get("/debug/kv"))

    def post(
        self, path: str, body: bytes | str | object, headers: dict | None = None
    ) -> tuple[int, bytes]:
        """POST raw bytes (or JSON of an object); (status, body bytes) whatever the status."""
        if not isinstance(body, bytes):
            body = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            conn.request(
                "POST", path, body, {"Content-Type": "application/json", **(headers or {})}
            )
            reply = conn.getresponse()
            return reply.status, reply.read()
        finally:
            conn.close()

    def wait_idle(self, timeout: float = 30) -> dict:
        """/debug/kv once no lane is active (or the timeout passes)."""
        deadline = time.time() + timeout
        kv = self.kv()
        while kv["active_lanes"] + kv["waiting_lanes"] and time.time() < deadline:
            time.sleep(0.05)
            kv = self.kv()
        return kv


async def read_stream(stream, hang_up_after: int | None = None) -> str | None:
    """The text of a streamed completion; None when it did not finish, or when the client hung
    up after `hang_up_after` chunks."""
    text, finish = "", None
    async for chunk in stream:
        for c in chunk.choices:
            text += c.text
            finish = c.finish_reason or finish
        if hang_up_after is not None:
            hang_up_after -= 1
            if hang_up_after == 0:
                await stream.close()
                return None
    return text if finish else None


def run_clients(server: LiveServer, one, n: int) -> list:
    """one(i, client) for i in range(n), all at once over one async client; their results."""

    async def main():
        client = server.async_client()
        try:
            return await asyncio.gather(*(one(i, client) for i in range(n)))
        finally:
            await client.close()

    return asyncio.run(main())


def openai_error(raw: bytes) -> dict:
    """The error object of an OpenAI-style error body, checked to have exactly its four fields."""
    body = json.loads(raw)
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


def assert_serving(server: LiveServer) -> None:
    """/health says ok and a small completion gets a 200."""
    assert json.loads(server.get("/health")) == {"status": "ok"}
    status, raw = server.post("/v1/completions", {"prompt": "hello", "max_tokens": 2})
    assert status == 200, raw
