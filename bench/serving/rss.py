"""Does the server's memory grow with requests served (issue 39's audit: RSS rose ~5 MiB per 100
requests over 1,100)? Serve N requests through the HTTP server (in this process, `make serve`'s
model, no drafter), twice, and report RSS against the KV blocks ever written: memory that tracks
the blocks touched is the KV pool's pages being touched for the first time (they are mapped at
start and committed on first write); memory that keeps rising once every block has been written,
or in the second pass over the same prompts, is a leak. Python allocations are compared with
tracemalloc between the two passes.

    .venv/bin/python -m bench.serving.rss [--requests 1100] [--out bench/results/rss-requests-cpu.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import socket
import threading
import time
import tracemalloc
import urllib.request
from pathlib import Path

import uvicorn

from lanes import build_engine
from lanes.server import build_app


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def post(port: int, body: dict) -> None:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    urllib.request.urlopen(req, timeout=300).read()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=1100)
    ap.add_argument("--out", default="bench/results/rss-requests-cpu.json")
    args = ap.parse_args()
    engine = build_engine()
    app = build_app(engine, "m")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    touched: set[int] = set()  # KV blocks ever written
    real_allocate = engine.cache.allocate

    def allocate(n: int):
        blocks = real_allocate(n)
        touched.update(blocks)
        return blocks

    engine.cache.allocate = allocate
    samples = []
    snapshots = []
    for pass_ in (1, 2):
        gc.collect()
        if pass_ == 2:
            tracemalloc.start()
            snapshots.append(tracemalloc.take_snapshot())
        for i in range(args.requests):
            body = {"prompt": f"Request {i}: tell me about the number {i * 7919}.",
                    "max_tokens": 8, "temperature": 0}  # fmt: skip
            post(port, body)
            if i % 100 == 99:
                samples.append(
                    {
                        "pass": pass_,
                        "requests": i + 1,
                        "rss_mib": round(rss_mib(), 1),
                        "blocks_touched": len(touched),
                    }  # fmt: skip
                )
                print(samples[-1], flush=True)
    gc.collect()
    snapshots.append(tracemalloc.take_snapshot())
    growth = snapshots[1].compare_to(snapshots[0], "lineno")[:8]
    server.should_exit = True
    report = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "model": engine.source,
        "kv_blocks_total": engine.pool.num_blocks,
        "bytes_per_block": engine.bytes_per_block,
        "prompt_cache_blocks_max": engine.cache.max_blocks
        if hasattr(engine.cache, "max_blocks")
        else None,
        "samples": samples,
        "python_growth_in_pass_2": [str(g) for g in growth],
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report["python_growth_in_pass_2"], indent=1))


if __name__ == "__main__":
    main()
