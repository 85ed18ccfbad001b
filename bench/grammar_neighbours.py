"""What one costly request does to everyone else, against `make serve`'s configuration (the default
model, the shipped drafter) on this machine. Two questions from issue 39's audit:

1. A 60-token greedy stream's wall time alone, beside a plain request, and beside a structured-
   output request whose grammar is costly to mask (one long `guided_choice` string): masks were
   computed on the engine thread, and the stream took 4.6x as long beside it.
2. Twelve 4 MB chat bodies at once: how long /health and another client's 1-token completion
   take meanwhile (were 6.6 s and 22-24 s).

    .venv/bin/python -m bench.grammar_neighbours [--out bench/results/grammar-neighbours-cpu.json]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import random
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

DRAFTER = "drafter/weights/smollm2-135m-instruct+ngram"
STREAM = {
    "messages": [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}],
    "max_tokens": 60,
    "temperature": 0,
    "ignore_eos": True,
    "stream": True,
}
CHOICE_CHARS = 100_000


def _post(port: int, body: dict | bytes, path: str = "/v1/chat/completions") -> tuple[int, bytes]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", path, raw, {"Content-Type": "application/json"})
    reply = conn.getresponse()
    data = reply.read()
    conn.close()
    return reply.status, data


def _neighbour(kind: str) -> dict | None:
    if kind == "alone":
        return None
    body = {
        "messages": [{"role": "user", "content": "Write out the answer."}],
        "max_tokens": 400,
        "temperature": 0,
        "ignore_eos": True,
    }
    if kind == "grammar":
        rng = random.Random(0)
        words = ["alpha", "beta", "gamma", "delta", " ", "x", "y", "z", "0", "1"]
        text = "".join(rng.choice(words) for _ in range(CHOICE_CHARS // 3))[:CHOICE_CHARS]
        body["guided_choice"] = [text]
    return body


def stream_beside(port: int, kind: str) -> tuple[float, float | None]:
    """The stream's wall time with the neighbour of `kind` running from 0.5 s before it, and
    the neighbour's own wall time."""
    neighbour = _neighbour(kind)
    thread, own = None, []

    def run_neighbour() -> None:
        start = time.perf_counter()
        status, raw = _post(port, neighbour)
        assert status == 200, raw[:300]
        own.append(time.perf_counter() - start)

    if neighbour is not None:
        thread = threading.Thread(target=run_neighbour, daemon=True)
        thread.start()
        time.sleep(0.5)
    start = time.perf_counter()
    status, raw = _post(port, STREAM)
    took = time.perf_counter() - start
    assert status == 200 and raw.decode().rstrip().endswith("[DONE]"), raw[:300]
    if thread is not None:
        thread.join()
    return took, own[0] if own else None


def big_bodies(port: int) -> dict:
    huge = json.dumps(
        {"messages": [{"role": "user", "content": "word " * 800_000}], "max_tokens": 1}
    ).encode()
    with ThreadPoolExecutor(12) as pool:
        futures = [pool.submit(_post, port, huge) for _ in range(12)]
        time.sleep(0.2)
        start = time.perf_counter()
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=600).read()
        health = time.perf_counter() - start
        start = time.perf_counter()
        status, _ = _post(port, {"prompt": "hello", "max_tokens": 1}, "/v1/completions")
        other = time.perf_counter() - start
        statuses = sorted({f.result()[0] for f in futures})
    return {"health_s": health, "other_completion_s": other, "big_statuses": statuses}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results/grammar-neighbours-cpu.json")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    server = subprocess.Popen(
        [sys.executable, "-m", "lanes.cli", "serve", "--drafter", DRAFTER, "--port", str(port),
         "--disable-uvicorn-access-log", "--disable-log-requests"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    try:
        deadline = time.time() + 300
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except OSError:
                assert time.time() < deadline and server.poll() is None, "server did not start"
                time.sleep(0.2)
        stream_beside(port, "alone")  # warm-up
        stream_beside(port, "grammar")
        runs: dict[str, list[float]] = {"alone": [], "plain": [], "grammar": []}
        neighbours: dict[str, list[float]] = {"plain": [], "grammar": []}
        for _ in range(args.repeats):  # interleaved, so drift hits every kind alike
            for kind in runs:
                took, own = stream_beside(port, kind)
                runs[kind].append(took)
                if own is not None:
                    neighbours[kind].append(own)
        medians = {k: statistics.median(v) for k, v in runs.items()}
        report = {
            "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
            "config": f"make serve: default model, --drafter {DRAFTER}, CPU",
            "stream": "60 tokens, greedy, chat",
            "grammar_neighbour": f"guided_choice of one {CHOICE_CHARS}-character string",
            "runs_s": runs,
            "neighbour_own_s": neighbours,
            "neighbour_own_median_s": {k: statistics.median(v) for k, v in neighbours.items()},
            "median_s": medians,
            "slowdown_beside_grammar_vs_plain": medians["grammar"] / medians["plain"],
            "slowdown_beside_grammar_vs_alone": medians["grammar"] / medians["alone"],
            "big_bodies": big_bodies(port),
        }
    finally:
        server.terminate()
        server.wait(30)
    print(json.dumps(report, indent=1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
