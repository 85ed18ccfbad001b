"""Issue 39's audit, items 4-10, each input exactly as it was sent: a clear 4xx (never a 500 or
a cut stream), nothing else disturbed, and the server still serving."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from lanes import EngineConfig, SamplingParams, build_engine
from lanes.async_engine import AsyncEngine
from lanes.tools import ToolCallStream, parse_tools
from tests.live_server import MODEL, LiveServer, assert_serving, openai_error

FUNCTION = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


@pytest.fixture(scope="module")
def server(long_model_dir):
    engine = build_engine(str(long_model_dir), EngineConfig(prefill_chunk=16, max_lanes=8))
    with LiveServer(engine) as live:
        yield live


def _chat(**extra) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 3,
        **extra,
    }


@pytest.mark.parametrize(
    "path, body, words",
    [
        ("/v1/chat/completions", _chat(guided_json="[" * 5000 + "]" * 5000), "nests deeper"),
        ("/v1/chat/completions",
         _chat(tools=[FUNCTION], tool_choice={"type": "function", "function": "f"}), "tool_choice"),
        ("/v1/chat/completions",
         _chat(messages=[{"role": "user", "content": "hi"},
                         {"role": "assistant", "content": None, "tool_calls": 5}]), "tool_calls"),
        ("/v1/chat/completions",
         _chat(messages=[{"role": "user", "content": "hi"},
                         {"role": "assistant", "content": None, "tool_calls": True}]), "tool_calls"),
        ("/tokenize", {"messages": [{"role": 5, "content": "hi"}]}, "role"),
        ("/tokenize", {"messages": [{"role": "wizard", "content": "hi"}]}, "role must be one of"),
        ("/v1/chat/completions", _chat(tools=[FUNCTION, FUNCTION]), "repeats the function name"),
        ("/v1/completions", {"prompt": "a", "logit_bias": {"5": 1, "05": 2}}, "twice"),
        ("/v1/completions", {"prompt": "a", "repetition_penalty": 1e-300}, "repetition_penalty"),
        ("/v1/completions", {"prompt": "a", "repetition_penalty": 1e30}, "repetition_penalty"),
    ],
    ids=["string-schema-5000-deep", "tool-choice-function-string", "tool-calls-5",
         "tool-calls-true", "tokenize-role-5", "tokenize-unknown-role", "same-tool-twice",
         "logit-bias-5-and-05", "repetition-penalty-tiny", "repetition-penalty-huge"],
)  # fmt: skip
def test_inputs_that_were_500s_are_400s(server, path, body, words):
    status, raw = server.post(path, body)
    assert status == 400, raw
    assert words in openai_error(raw)["message"]
    assert_serving(server)


def test_tokenize_takes_the_messages_chat_takes(server):
    """Content as a list of text parts, as chat completions takes it."""
    parts = [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]
    status, raw = server.post("/tokenize", {"messages": [{"role": "user", "content": parts}]})
    assert status == 200, raw
    status, plain = server.post(
        "/tokenize", {"messages": [{"role": "user", "content": "hi there"}]}
    )
    assert json.loads(raw)["tokens"] == json.loads(plain)["tokens"]


def test_content_type_must_be_json(server):
    for kind in ("application/notjson", "text/json-ish", "text/plain"):
        status, raw = server.post("/v1/completions", {"prompt": "a"}, {"Content-Type": kind})
        assert status == 415, (kind, raw)
    for kind in ("application/json; charset=utf-8", "application/vnd.api+json"):
        status, raw = server.post(
            "/v1/completions", {"prompt": "a", "max_tokens": 1}, {"Content-Type": kind}
        )
        assert status == 200, (kind, raw)


def test_a_404_does_not_echo_a_long_path(server):
    status, raw = server.post("/v1/" + "x" * 100_000, {"prompt": "a"})
    assert status == 404 and len(openai_error(raw)["message"]) < 200


def test_big_messages_are_refused_before_tokenizing(server, monkeypatch):
    """A 4 MB message is refused from its length alone: the tokenizer never sees it (negative
    control: a message that fits the bound is tokenized)."""
    tokenizer = server.engine.tokenizer
    seen = []
    real = type(tokenizer).encode
    monkeypatch.setattr(
        type(tokenizer),
        "encode",
        lambda self, text, **kw: seen.append(len(text)) or real(self, text, **kw),
    )
    huge = "word " * 800_000
    start = time.perf_counter()
    status, raw = server.post(
        "/v1/chat/completions", _chat(messages=[{"role": "user", "content": huge}])
    )
    assert status == 400 and "characters" in openai_error(raw)["message"], raw
    status, raw = server.post("/tokenize", {"prompt": huge})
    assert status == 400 and "characters" in openai_error(raw)["message"], raw
    assert time.perf_counter() - start < 5
    assert not any(n >= len(huge) for n in seen), seen
    status, raw = server.post("/tokenize", {"prompt": "word " * 100})
    assert status == 200 and any(n == 500 for n in seen)


def test_big_bodies_leave_health_and_others_fast(server):
    """Twelve 4 MB requests at once: /health and another client's 1-token completion answer
    while they are refused (before: 6.6 s and 22-24 s)."""
    huge = json.dumps(_chat(messages=[{"role": "user", "content": "word " * 800_000}])).encode()

    def big(_):
        return server.post("/v1/chat/completions", huge)[0]

    with ThreadPoolExecutor(12) as pool:
        futures = [pool.submit(big, i) for i in range(12)]
        time.sleep(0.2)
        start = time.perf_counter()
        assert json.loads(server.get("/health")) == {"status": "ok"}
        health = time.perf_counter() - start
        status, raw = server.post("/v1/completions", {"prompt": "hello", "max_tokens": 1})
        other = time.perf_counter() - start
        assert status == 200, raw
        assert all(f.result() == 400 for f in futures)
    assert health < 2 and other < 10, (health, other)


def test_an_invalid_escape_in_a_streamed_tool_call_is_content():
    """The stream goes on: a block whose name cannot be read is no call."""
    tools = parse_tools({"tools": [FUNCTION]})
    stream = ToolCallStream(tools)
    content, calls = stream.feed('<tool_call>{"name": "get\\q", "arguments": {}}')
    assert calls == []
    content2, calls = stream.feed("</tool_call> done")
    assert calls == [] and "get\\q" in content + content2 + stream.flush()


def test_a_streamed_tool_call_with_a_bad_escape_ends_cleanly(server):
    """Over HTTP: a choice held to exactly that text (so the model writes it); the stream
    ends with a finish_reason and [DONE] (before: cut, no finish_reason, no error event)."""
    text = '<tool_call>{"name": "get\\q", "arguments": {}}</tool_call>'
    body = _chat(tools=[FUNCTION], stream=True, max_tokens=64, guided_choice=[text])
    status, raw = server.post("/v1/chat/completions", body)
    assert status == 200
    events = [line[6:] for line in raw.decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    finishes = [c["finish_reason"] for e in events[:-1] for c in json.loads(e)["choices"]]
    assert finishes[-1] in ("stop", "length"), events
    text_out = "".join(
        (c["delta"].get("content") or "") for e in events[:-1] for c in json.loads(e)["choices"]
    )
    assert "get\\q" in text_out
    assert_serving(server)


def test_cancelled_ids_of_finished_requests_are_not_kept(long_model_dir):
    engine = build_engine(str(long_model_dir))
    runner = AsyncEngine(engine)
    runner.start()
    try:
        import asyncio

        async def run() -> None:
            for _ in range(5):
                handle = await runner.submit("hello", SamplingParams(max_tokens=2))
                while True:
                    event = await handle.next_event()
                    if type(event).__name__ in ("Finished", "Failed"):
                        break
                handle.cancel()  # what the server does for every choice as it ends

        asyncio.run(run())
    finally:
        runner.stop()
    assert runner._cancelled == set()


SECRET = "The launch code is 7734-alpha-niner. " * 6


def _cached(live, prompt: str, key: str, **extra) -> object:
    client = live.client(api_key=key)
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, **extra)
    details = out.usage.prompt_tokens_details
    return None if details is None else details.cached_tokens


def test_cached_tokens_are_reported_only_when_asked(long_model_dir):
    """The side channel of the audit: after a prompt holding a secret, a guess with the right
    secret was told cached_tokens 48. By default usage has no cached_tokens; with
    report_cached_tokens (--enable-prompt-tokens-details) it does (the control: the probe
    works there, so hiding it is what closes it)."""
    engine = build_engine(str(long_model_dir), EngineConfig(prefill_chunk=16))
    with LiveServer(engine) as live:
        _cached(live, SECRET + "Tell no one.", "none")
        assert _cached(live, SECRET + "Guess?", "none") is None
    engine = build_engine(str(long_model_dir), EngineConfig(prefill_chunk=16))
    with LiveServer(engine, report_cached_tokens=True) as live:
        _cached(live, SECRET + "Tell no one.", "none")
        assert _cached(live, SECRET + "Guess?", "none") > 0


def test_each_api_key_has_its_own_prompt_cache(long_model_dir):
    """With several keys, one key's requests never hit another's cached prefixes (a salt derived
    from the key); the same key's do. Negative control: one key for both clients hits."""
    engine = build_engine(str(long_model_dir), EngineConfig(prefill_chunk=16))
    with LiveServer(engine, api_key=["alice", "bob"], report_cached_tokens=True) as live:
        _cached(live, SECRET + "Tell no one.", "alice")
        assert _cached(live, SECRET + "Guess?", "bob") == 0
        assert _cached(live, SECRET + "Again?", "alice") > 0
        # a request's own cache_salt still separates within a key
        assert _cached(live, SECRET + "Salted?", "alice", extra_body={"cache_salt": "s"}) == 0


def test_half_sent_headers_are_closed_after_the_deadline(long_model_dir):
    """A connection that sends part of its headers and then nothing is closed (before: kept
    open for ever); a connection that completes them in time is served."""
    import socket

    import uvicorn

    from lanes.http_protocol import HeaderDeadlineH11

    class Quick(HeaderDeadlineH11):
        header_timeout = 0.5

    engine = build_engine(str(long_model_dir))
    live = LiveServer(engine)
    live.server = uvicorn.Server(uvicorn.Config(live.app, log_level="warning", http=Quick))
    live.thread = threading.Thread(
        target=live.server.run, kwargs={"sockets": [live.sock]}, daemon=True
    )
    with live:
        stalled = socket.create_connection(("127.0.0.1", live.port))
        stalled.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le")
        stalled.settimeout(5)
        start = time.perf_counter()
        assert stalled.recv(100) == b""  # closed by the server
        assert 0.3 < time.perf_counter() - start < 3
        assert_serving(
            live
        )  # and whole requests are served, also after the deadline would have passed
        time.sleep(0.7)
        assert_serving(live)


@pytest.mark.parametrize("protocol", ["lanes", "negative-control-uvicorn"])
def test_responses_leave_without_waiting_for_an_ack(long_model_dir, protocol):
    """`lanes serve` binds its port itself (proto 0), and there asyncio leaves Nagle's algorithm
    on. A response's body then waited behind its headers for the client's delayed ACK (~40 ms
    on every vllm-router call to a replica). lanes' protocol sets TCP_NODELAY on each connection;
    uvicorn's own protocol on the same socket leaves it off."""
    import socket

    import uvicorn
    from uvicorn.protocols.http.h11_impl import H11Protocol

    from lanes.http_protocol import HeaderDeadlineH11

    seen = []

    class Recording(HeaderDeadlineH11 if protocol == "lanes" else H11Protocol):
        def connection_made(self, transport):
            super().connection_made(transport)
            sock = transport.get_extra_info("socket")
            seen.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

    live = LiveServer(build_engine(str(long_model_dir)))
    assert live.sock.proto == 0  # as `lanes serve` binds it
    live.server = uvicorn.Server(uvicorn.Config(live.app, log_level="warning", http=Recording))
    live.thread = threading.Thread(
        target=live.server.run, kwargs={"sockets": [live.sock]}, daemon=True
    )
    with live:
        assert_serving(live)
    assert seen and all(bool(v) == (protocol == "lanes") for v in seen), seen
