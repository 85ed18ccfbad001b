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


def _wait_ready(url: str, proc: subprocess.Popen, what: str, seconds: float = 60) -> None:
    """Until `url` answers 200; the process is killed and the test fails if it does not."""
    deadline = time.time() + seconds
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            if time.time() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError(f"{what} did not start") from None
            time.sleep(0.2)


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
    _wait_ready(url + "/v1/models", proc, "vllm-router")
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


def _replica(model_dir: Path, port: int) -> subprocess.Popen:
    """`lanes serve` as its own process (a replica to kill), ready when /health answers."""
    code = "import sys; from lanes.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "serve", "--model", str(model_dir), "--device", "cpu",
         "--port", str(port), "--served-model-name", "tiny"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    _wait_ready(f"http://127.0.0.1:{port}/health", proc, "lanes serve", seconds=120)
    return proc


def _stream(url: str, messages: list[dict], max_tokens: int, out: dict) -> None:
    """A streamed chat through `url`: the text, the finish reason, and whether [DONE] came."""
    body = {"model": "tiny", "messages": messages, "max_tokens": max_tokens, "stream": True,
            "temperature": 0, "ignore_eos": True}  # fmt: skip
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    out.update(text="", finish=None, done=False, chunks=0)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body),
                     {"Content-Type": "application/json"})  # fmt: skip
        response = conn.getresponse()
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                out["done"] = True
                break
            choice = json.loads(line[6:])["choices"][0]
            out["text"] += choice["delta"].get("content") or ""
            out["finish"] = choice.get("finish_reason") or out["finish"]
            out["chunks"] += 1
    except (OSError, http.client.HTTPException) as e:
        out["error"] = repr(e)
    finally:
        conn.close()


def _served(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("vllm:request_success_total")
    )


def test_a_replica_killed_mid_stream_loses_nothing_else(long_model_dir):
    """Two replicas (processes) behind the router, round robin with 1 s health checks and its
    retries on; one is killed with SIGKILL while each streams a long answer. No client hangs:
    the killed replica's stream ends (without a finish reason or [DONE]: the router does not
    report it, docs/replicas.md) holding a prefix of the answer, the other's stream completes
    equal to the answer; requests after the kill all succeed with that answer's text; the
    replica restarted on its port is sent requests again."""
    if not Path(ROUTER).exists():
        pytest.skip("vllm-router is not installed here (a test dependency on Linux x86_64)")
    import threading

    ports = [_free_port(), _free_port()]
    procs = [_replica(long_model_dir, p) for p in ports]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    router_port = _free_port()
    router = subprocess.Popen(
        [ROUTER, "--worker-urls", *urls, "--policy", "round_robin", "--port", str(router_port),
         "--prometheus-port", str(_free_port()), "--log-level", "warning",
         "--health-check-interval-secs", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    router_url = f"http://127.0.0.1:{router_port}"
    try:
        _wait_ready(router_url + "/v1/models", router, "vllm-router")
        messages = [{"role": "user", "content": "count with me"}]
        answer: dict = {}
        _stream(urls[1], messages, 1500, answer)  # the answer, from one replica directly
        assert answer["done"] and answer["finish"] == "length"
        streams = [{}, {}]
        threads = [
            threading.Thread(target=_stream, args=(router_url, messages, 1500, s)) for s in streams
        ]
        for t in threads:
            t.start()
        deadline = time.time() + 60
        while min(s.get("chunks", 0) for s in streams) < 5:  # both under way
            assert time.time() < deadline, streams
            time.sleep(0.01)
        procs[0].kill()
        procs[0].wait(10)
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads), "a client hung"
        whole = [s for s in streams if s["done"]]
        cut = [s for s in streams if not s["done"]]
        assert len(whole) == 1 and len(cut) == 1, streams  # round robin: one on each replica
        assert whole[0]["text"] == answer["text"] and whole[0]["finish"] == "length"
        assert cut[0]["finish"] is None and answer["text"].startswith(cut[0]["text"])
        for _ in range(4):  # the router stops sending to it (or retries on the live one)
            after: dict = {}
            _stream(router_url, messages, 200, after)
            assert after["done"] and answer["text"].startswith(after["text"]), after
        procs[0] = _replica(long_model_dir, ports[0])  # restarted on the same port
        deadline = time.time() + 60
        while _served(ports[0]) == 0:  # the router sends it requests again
            assert time.time() < deadline, "the restarted replica got no request"
            again: dict = {}
            _stream(router_url, messages, 50, again)
            assert again["done"] and answer["text"].startswith(again["text"])
            time.sleep(0.5)
    finally:
        router.terminate()
        for proc in procs:
            proc.kill()
        router.wait(10)
        for proc in procs:
            proc.wait(10)
