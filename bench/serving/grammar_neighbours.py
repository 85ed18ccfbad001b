"""What one costly request does to everyone else, against `make serve`'s configuration (the default
model, the shipped drafter) on this machine. Two questions from issue 39's audit:

1. A 60-token greedy stream's wall time alone, beside a plain request, and beside a structured-
   output request whose grammar is costly to mask (one long `guided_choice` string): masks were
   computed on the engine thread, and the stream took 4.6x as long beside it.
2. Twelve 4 MB chat bodies at once: how long /health and another client's 1-token completion
   take meanwhile (were 6.6 s and 22-24 s).

3. With --check-exact: structured-output requests (a JSON schema; greedy and seeded) answered
   drafted and with `"draft": false` are the same, token for token (the masks' path: on CUDA
   computed on a helper thread while the forward runs, `--prefetch-masks`).

    .venv/bin/python -m bench.serving.grammar_neighbours [--out bench/results/grammar-neighbours-cpu.json]
    python -m bench.serving.grammar_neighbours --model DIR --drafter ngram --serve-arg=--no-prefetch-masks
"""

from __future__ import annotations

import argparse
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

import torch

from bench.serving.audit import post

DRAFTER = "drafter/weights/smollm2-135m-instruct+ngram"
CHAT = "/v1/chat/completions"
STREAM = {
    "messages": [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}],
    "max_tokens": 60,
    "temperature": 0,
    "ignore_eos": True,
    "stream": True,
}
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 6},
        "n": {"type": "integer"},
    },
    "required": ["name", "tags", "n"],
}
EXACT_PROMPTS = ["one two three one two three one two", "Paris is the capital of France.", "x"]


def _neighbour(kind: str, choice_chars: int) -> dict | None:
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
        text = "".join(rng.choice(words) for _ in range(choice_chars // 3))[:choice_chars]
        body["guided_choice"] = [text]
    return body


def stream_beside(port: int, kind: str, choice_chars: int) -> tuple[float, float | None]:
    """The stream's wall time with the neighbour of `kind` running from 0.5 s before it, and
    the neighbour's own wall time."""
    neighbour = _neighbour(kind, choice_chars)
    thread, own = None, []

    def run_neighbour() -> None:
        start = time.perf_counter()
        status, raw = post(port, CHAT, neighbour)
        assert status == 200, raw[:300]
        own.append(time.perf_counter() - start)

    if neighbour is not None:
        thread = threading.Thread(target=run_neighbour, daemon=True)
        thread.start()
        time.sleep(0.5)
    start = time.perf_counter()
    status, raw = post(port, CHAT, STREAM)
    took = time.perf_counter() - start
    assert status == 200 and raw.decode().rstrip().endswith("[DONE]"), raw[:300]
    if thread is not None:
        thread.join()
    return took, own[0] if own else None


def check_exact(port: int) -> dict:
    """Drafted against `draft: false` under a JSON schema, greedy and seeded: mismatches."""
    pairs = mismatches = drafted = 0
    for prompt in EXACT_PROMPTS:
        for sampling in ({"temperature": 0}, {"temperature": 0.8, "seed": 7}):
            body = {"prompt": prompt, "max_tokens": 96, "guided_json": SCHEMA, "logprobs": 1,
                    **sampling}  # fmt: skip
            outs = []
            for draft in (True, False):
                status, raw = post(port, "/v1/completions", {**body, "draft": draft})
                assert status == 200, raw[:300]
                reply = json.loads(raw)
                choice, details = reply["choices"][0], reply["usage"]["completion_tokens_details"]
                drafted += (
                    details["accepted_prediction_tokens"] + details["rejected_prediction_tokens"]
                )
                outs.append((choice["text"], choice["logprobs"]["token_logprobs"]))
            pairs += 1
            mismatches += outs[0] != outs[1]
    return {"pairs": pairs, "mismatches": mismatches, "draft_tokens_verified": drafted}


def big_bodies(port: int) -> dict:
    huge = json.dumps(
        {"messages": [{"role": "user", "content": "word " * 800_000}], "max_tokens": 1}
    ).encode()
    with ThreadPoolExecutor(12) as pool:
        futures = [pool.submit(post, port, CHAT, huge) for _ in range(12)]
        time.sleep(0.2)
        start = time.perf_counter()
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=600).read()
        health = time.perf_counter() - start
        start = time.perf_counter()
        status, _ = post(port, "/v1/completions", {"prompt": "hello", "max_tokens": 1})
        other = time.perf_counter() - start
        statuses = sorted({f.result()[0] for f in futures})
    return {"health_s": health, "other_completion_s": other, "big_statuses": statuses}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results/grammar-neighbours-cpu.json")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model", default=None, help="default: the default model")
    ap.add_argument("--drafter", default=DRAFTER)
    ap.add_argument("--serve-arg", action="append", default=[], help="more `lanes serve` flags")
    ap.add_argument("--choice-chars", type=int, default=100_000)
    ap.add_argument("--check-exact", action="store_true")
    args = ap.parse_args()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    server = subprocess.Popen(
        [sys.executable, "-m", "lanes.cli", "serve", "--drafter", args.drafter, "--port", str(port),
         "--disable-uvicorn-access-log", "--disable-log-requests", *args.serve_arg,
         *(["--model", args.model] if args.model else [])],
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
        choice = args.choice_chars
        exact = check_exact(port) if args.check_exact else None
        stream_beside(port, "alone", choice)  # warm-up
        stream_beside(port, "grammar", choice)
        runs: dict[str, list[float]] = {"alone": [], "plain": [], "grammar": []}
        neighbours: dict[str, list[float]] = {"plain": [], "grammar": []}
        for _ in range(args.repeats):  # interleaved, so drift hits every kind alike
            for kind in runs:
                took, own = stream_beside(port, kind, choice)
                runs[kind].append(took)
                if own is not None:
                    neighbours[kind].append(own)
        medians = {k: statistics.median(v) for k, v in runs.items()}
        report = {
            "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
            + (f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""),
            "config": f"lanes serve --model {args.model or 'default'} --drafter {args.drafter} "
            + " ".join(args.serve_arg),
            "stream": "60 tokens, greedy, chat",
            "grammar_neighbour": f"guided_choice of one {choice}-character string, 400 tokens",
            "drafted_vs_undrafted_under_a_schema": exact,
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
