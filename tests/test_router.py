"""lanes replicas behind an existing router (vllm-router, cache-aware policy), as docs/replicas.md
deploys them: the router takes lanes' health checks and its render endpoints (the prompt's token
ids, to route by them); a request's output through the router equals the same request sent to
one replica directly, greedy and seeded; the turns of a conversation land where its prefix is
cached. Plus the render endpoints themselves."""

from __future__ import annotations

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
    if not Path(ROUTER).exists():
        pytest.skip("vllm-router is not installed here (a test dependency on Linux x86_64)")
    workers, _ = replicas
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
    yield url
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
