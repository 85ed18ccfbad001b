"""Prompt-cache hits across replicas behind vllm-router: multi-turn conversations, 1 / 2 / 4
replicas, the cache-aware policy against round robin.

    python -m bench.serving replicas [--model M] [--replicas 1,2,4] [--conversations 8]
        [--turns 6] [--new-tokens 8] [--concurrent] [--pin] [--router-args "..."]

Each setting starts N `lanes serve` replicas (subprocesses) and a vllm-router in front of them,
then sends `--conversations` conversations of `--turns` turns that share one system prompt,
interleaved (turn 1 of every conversation, then turn 2, ...), one request at a time (with
`--concurrent`: every conversation's turn at once), greedy, streamed. Reported: the prompt-cache hit rate (every replica's `lanes_cached_prompt_tokens` over
its `lanes_prompt_tokens`), median and p90 time to first token seen by the client, and
whether every conversation's text equals the one-replica run's, and the throughput (the
replicas' generated tokens over the run's wall time). N replicas share this machine's cores, so
TTFT across N says little on a 2-core box; the hit rate is the point. `--pin`: replica i runs on
core i alone with one thread (taskset), so N replicas use N cores (issue 46's scaling target).
`--router-args`: more vllm-router flags (e.g. lower balance thresholds for cache_aware). Writes
bench/results/replicas-<machine>[-concurrent][-pinned].json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench import RESULTS

SYSTEM = (
    "You are a helpful assistant for a small hardware store. Answer in two sentences at most, "
    "politely, and say when you do not know. The store opens at nine and closes at six."
)
QUESTIONS = [
    "Do you sell hammers?", "What time do you open?", "Can I return a drill?",
    "Which glue holds wood best?", "Do you cut keys?", "How much is a ladder?",
    "Is there parking?", "Do you deliver?", "What paint dries fastest?", "Thanks, bye.",
]  # fmt: skip


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read().decode()


def _wait(url: str, proc: subprocess.Popen, seconds: float = 300) -> None:
    deadline = time.time() + seconds
    while True:
        try:
            _get(url)
            return
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"{url} did not come up") from None
            time.sleep(0.3)


def _counter(metrics: str, name: str) -> float:
    line = next(x for x in metrics.splitlines() if x.startswith(name + "_total "))
    return float(line.split()[-1])


def _stream(url: str, messages: list[dict], new_tokens: int) -> tuple[str, float]:
    """(the answer, seconds to its first content chunk)."""
    body = {"model": "m", "messages": messages, "max_tokens": new_tokens, "temperature": 0,
            "stream": True}  # fmt: skip
    request = urllib.request.Request(
        url + "/v1/chat/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    start, first, text = time.perf_counter(), None, []
    with urllib.request.urlopen(request, timeout=300) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            delta = json.loads(line[6:])["choices"][0]["delta"].get("content")
            if delta:
                first = first or time.perf_counter() - start
                text.append(delta)
    return "".join(text), first or time.perf_counter() - start


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _own_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def run_setting(args, n: int, policy: str, router: str) -> dict:
    procs, workers = [], []
    try:
        for _ in range(n):
            port = _port()
            cmd = [sys.executable, "-m", "lanes.cli", "serve", "--port", str(port),
                   "--served-model-name", "m"] + (["--model", args.model] if args.model else [])  # fmt: skip
            env = None
            if args.pin:  # core i alone, one thread
                cmd = ["taskset", "-c", str(len(procs) % os.cpu_count())] + cmd
                env = dict(os.environ, OMP_NUM_THREADS="1")
            procs.append(
                subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
            )
            workers.append(f"http://127.0.0.1:{port}")
        for url, proc in zip(workers, procs, strict=True):
            _wait(url + "/health", proc)
        port = _port()
        procs.append(
            subprocess.Popen(
                [
                    router,
                    "--worker-urls",
                    *workers,
                    "--policy",
                    policy,
                    "--port",
                    str(port),
                    "--prometheus-port",
                    str(_port()),
                    "--log-level",
                    "warning",
                    *args.router_args.split(),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )  # fmt: skip
        )
        front = f"http://127.0.0.1:{port}"
        _wait(front + "/v1/models", procs[-1])
        chats = [[{"role": "system", "content": SYSTEM}] for _ in range(args.conversations)]
        ttft = []

        def take_turn(c: int, turn: int) -> float:
            chat = chats[c]
            chat.append({"role": "user", "content": QUESTIONS[(turn + c) % len(QUESTIONS)]})
            answer, first = _stream(front, chat, args.new_tokens)
            chat.append({"role": "assistant", "content": answer})
            return first

        # CPU time of each process over the timed part: on a machine with as many cores as
        # replicas, what the router and the client take is taken from the replicas
        cpu_before = [_cpu_seconds(p.pid) for p in procs] + [_own_cpu_seconds()]
        start = time.perf_counter()
        for turn in range(args.turns):
            if args.concurrent:  # every conversation's turn at once
                with ThreadPoolExecutor(len(chats)) as pool:
                    ttft += list(pool.map(lambda c, t=turn: take_turn(c, t), range(len(chats))))
            else:
                ttft += [take_turn(c, turn) for c in range(len(chats))]
        seconds = time.perf_counter() - start
        cpu_after = [_cpu_seconds(p.pid) for p in procs] + [_own_cpu_seconds()]
        cpu = [round(b - a, 2) for a, b in zip(cpu_before, cpu_after, strict=True)]
        metrics = [_get(w + "/metrics") for w in workers]
        generated = sum(_counter(m, "lanes_generation_tokens") for m in metrics)
        prompt = sum(_counter(m, "lanes_prompt_tokens") for m in metrics)
        cached = sum(_counter(m, "lanes_cached_prompt_tokens") for m in metrics)
        per_replica = [int(_counter(m, "lanes_prompt_tokens")) for m in metrics]
        ttft.sort()
        return {
            "replicas": n,
            "policy": policy,
            "hit_rate": round(cached / prompt, 3),
            "prompt_tokens_per_replica": per_replica,
            "ttft_median_ms": round(statistics.median(ttft) * 1e3, 1),
            "ttft_p90_ms": round(ttft[int(0.9 * (len(ttft) - 1))] * 1e3, 1),
            "seconds": round(seconds, 2),
            "output_tok_s": round(generated / seconds, 1),
            # CPU seconds over the timed part: replicas (the taskset wrapper execs the server),
            # the router, and this client
            "cpu_seconds": {"replicas": cpu[:n], "router": cpu[n], "client": cpu[n + 1]},
            "texts": [[m["content"] for m in chat if m["role"] == "assistant"] for chat in chats],
        }
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="default: lanes' default model")
    ap.add_argument("--replicas", default="1,2,4")
    ap.add_argument("--policies", default="cache_aware,round_robin")
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--new-tokens", type=int, default=8)
    ap.add_argument(
        "--concurrent", action="store_true", help="send every conversation's turn at once"
    )
    ap.add_argument("--pin", action="store_true", help="replica i on core i alone, one thread")
    ap.add_argument("--router-args", default="", help="more vllm-router flags, one string")
    args = ap.parse_args()
    router = shutil.which("vllm-router") or str(Path(sys.executable).parent / "vllm-router")
    rows = []
    for n in [int(x) for x in args.replicas.split(",")]:
        for policy in args.policies.split(",") if n > 1 else ["round_robin"]:
            row = run_setting(args, n, policy, router)
            row["same_text_as_one_replica"] = row["texts"] == rows[0]["texts"] if rows else True
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "texts"}), flush=True)
    out = {
        "machine": f"{platform.processor() or platform.machine()}",
        "model": args.model or "default (SmolLM2-135M-Instruct Q4_1 GGUF)",
        "conversations": args.conversations,
        "turns": args.turns,
        "new_tokens": args.new_tokens,
        "rows": [{k: v for k, v in r.items() if k != "texts"} for r in rows],
    }
    out["concurrent"] = args.concurrent
    out["pinned"] = args.pin
    out["router_args"] = args.router_args
    suffix = ("-concurrent" if args.concurrent else "") + ("-pinned" if args.pin else "")
    path = RESULTS / f"replicas-{platform.machine()}{suffix}.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
