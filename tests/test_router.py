"""lanes replicas behind an existing router (vllm-router, cache-aware policy), as docs/replicas.md
deploys them: the router takes lanes' health checks and its render endpoints (the prompt's token
ids, to route by them); a request's output through the router equals the same request sent to
one replica directly, greedy and seeded; the turns of a conversation land where its prefix is
cached. Plus the render endpoints themselves."""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from lanes import EngineConfig, build_engine
from tests.live_server import LiveServer

ROUTER = shutil.which("vllm-router") or str(Path(sys.executable).parent / "vllm-router")
SYSTEM = "You are a careful assistant. Answer every question briefly and politely, in English."


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cached(server: LiveServer) -> float:
    text = server.get("/metrics")
    line = next(x for x in text.splitlines() if x.startswith("lanes_cached_prompt_tokens_total"))
    return float(line.split()[-1])


@pytest.fixture(scope="module")
def replicas(llama_dir):
    """Two replicas of the tiny model (each its own engine) and a direct one for reference."""
    servers = [LiveServer(build_engine(str(llama_dir), EngineConfig())) for _ in range(3)]
    for s in servers:
        s.__enter__()
    yield servers[:2], servers[2]
    for s in servers:
        s.__exit__(None, None, None)


@pytest.fixture(scope="module")
def router(replicas):
    yield from _router(replicas[0])


def _router(workers):
    if not Path(ROUTER).exists():
        pytest.skip("vllm-router is not installed here (a test dependency on Linux x86_64)")
    port = _free_port()
    proc = subprocess.Popen(
        [ROUTER, "--worker-urls", *[w.url for w in workers], "--policy", "cache_aware",
         "--port", str(port), "--prometheus-port", str(_free_port()), "--log-level", "warning",
         "--disable-retries"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while True:
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=5) as r:
                if r.status == 200:
                    break
        except OSError:
            if time.time() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError("vllm-router did not start") from None
            time.sleep(0.2)
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def _chat(url: str, messages: list[dict], **params) -> dict:
    body = {"model": "tiny", "messages": messages, "max_tokens": 12, **params}
    request = urllib.request.Request(
        url + "/v1/chat/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as r:
        return json.loads(r.read())


@pytest.mark.parametrize("params", [{"temperature": 0}, {"temperature": 0.9, "seed": 7}],
                         ids=["greedy", "seeded"])  # fmt: skip
def test_through_the_router_equals_one_replica_directly(replicas, router, params):
    workers, direct = replicas
    before = [_cached(w) for w in workers]
    messages = [{"role": "system", "content": SYSTEM}]
    for turn in ("hello there", "and what is two plus two", "thank you, goodbye"):
        messages.append({"role": "user", "content": turn})
        routed = _chat(router, messages, **params)["choices"][0]["message"]["content"]
        alone = _chat(direct.url, messages, **params)["choices"][0]["message"]["content"]
        assert routed == alone, turn
        messages.append({"role": "assistant", "content": routed})
    # the later turns found the conversation's prefix cached where the router sent them
    assert sum(_cached(w) for w in workers) > sum(before)


def test_render_gives_the_prompt_the_request_would_run_on(replicas):
    _, server = replicas
    messages = [{"role": "user", "content": "hi"}]
    status, body = server.post("/v1/chat/completions/render", {"messages": messages})
    assert status == 200
    status, tokens = server.post("/tokenize", {"messages": messages})
    assert json.loads(body)["token_ids"] == json.loads(tokens)["tokens"]
    status, body = server.post("/v1/completions/render", {"prompt": ["a b", "c"]})
    assert status == 200 and [len(r["token_ids"]) > 0 for r in json.loads(body)] == [True, True]
    status, body = server.post("/v1/chat/completions/render", {"model": "other", "messages": []})
    assert status == 404 and json.loads(body)["error"]["param"] == "model"
    status, body = server.post("/v1/chat/completions/render", {"messages": "not a list"})
    assert status == 400


def _finished(server: LiveServer, reason: str) -> float:
    prefix = f'lanes_requests_total{{finish_reason="{reason}"}}'
    lines = [x for x in server.get("/metrics").splitlines() if x.startswith(prefix)]
    return float(lines[0].split()[-1]) if lines else 0.0


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
def test_a_client_that_leaves_the_router_cancels_its_request_on_the_replica(long_model_dir, stream):
    """The router closes its connection to the replica when the client goes; lanes ends the
    request there (finish_reason "abort") instead of generating the rest."""
    with LiveServer(build_engine(str(long_model_dir), EngineConfig())) as replica:
        for url in _router([replica]):
            body = {"model": "tiny", "messages": [{"role": "user", "content": "a long story"}],
                    "max_tokens": 3000, "ignore_eos": True, "stream": stream}  # fmt: skip
            conn = http.client.HTTPConnection("127.0.0.1", int(url.rsplit(":", 1)[1]), timeout=60)
            conn.request("POST", "/v1/chat/completions", json.dumps(body),
                         {"Content-Type": "application/json"})  # fmt: skip
            if stream:
                conn.getresponse().read(100)  # the stream has started
            else:
                time.sleep(1.0)
            conn.sock.close()
            conn.close()
            deadline = time.time() + 30
            while _finished(replica, "abort") < 1 and time.time() < deadline:
                time.sleep(0.2)
            assert _finished(replica, "abort") == 1
            assert _finished(replica, "length") == 0
