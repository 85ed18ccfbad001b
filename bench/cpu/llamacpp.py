"""lanes and llama.cpp side by side on the CPU (issue 21): the default model's GGUF
(SmolLM2-135M-Instruct, Q4_1), batch 1, everyday chat prompts, greedy, up to 128 new tokens;
each configuration in its own process (so its peak RSS is its own), the processes alternating
(A B C D A B C D ...), tok/s medians over every prompt and pass.

llama-cpp-python is a bench-only dependency, kept out of the project: build it into a venv of
its own (on the 2-core dev box ~12 minutes; the native build crashed at the first forward there,
these flags did not):

    python3 -m venv /tmp/llamavenv
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \\
      -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" \\
      /tmp/llamavenv/bin/pip install llama-cpp-python==0.3.36
    python -m bench.cpu.llamacpp --llama-python /tmp/llamavenv/bin/python [--passes 2] [--prompts 4]

tok/s counts the prompt's prefill in (time from the request to its last token), as a user
waiting for an answer sees it; decode tok/s (first to last token) is reported beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench import ROOT

SHIPPED_DRAFTER = ROOT / "drafter" / "weights" / "smollm2-135m-instruct+ngram"
CONFIGS = {
    "lanes exact": {"exact": True},
    "lanes exact + shipped drafter (make serve)": {"exact": True, "drafter": str(SHIPPED_DRAFTER)},
    "lanes fast": {"exact": False},
    "llama.cpp": None,
}


def prompts(n: int) -> list[list[dict]]:
    """The first prompt of each category of bench/data/everyday_prompts.json, up to n."""
    data = json.loads((ROOT / "bench" / "data" / "everyday_prompts.json").read_text())
    items = data["prompts"] if isinstance(data, dict) else data
    seen, chats = set(), []
    for item in items:
        if item["category"] in seen:
            continue
        seen.add(item["category"])
        chats.append(item["messages"])
    return chats[:n]


def peak_rss_mib() -> float:
    # not lanes.metrics.peak_memory_bytes: the llama.cpp child's Python has no lanes (or torch)
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def child_lanes(gguf: str, config: dict, chats, new: int) -> list[dict]:
    import torch

    from lanes import EngineConfig, SamplingParams, build_engine

    torch.set_num_threads(2)
    engine = build_engine(gguf, EngineConfig(**config))
    params = SamplingParams(max_tokens=new)
    engine.generate([chats[0]], SamplingParams(max_tokens=8), cache_salt="warm")
    runs = []
    for i, chat in enumerate(chats):
        start = time.perf_counter()
        (out,) = engine.generate([chat], params, cache_salt=f"run{i}-{time.time()}")
        end = time.perf_counter()
        t = out.token_times
        runs.append(
            {
                "tokens": len(out.token_ids),
                "seconds": end - start,
                "decode_tok_s": (len(t) - 1) / (t[-1] - t[0]) if len(t) > 1 else None,
            }
        )
    return runs


def child_llama(gguf: str, chats, new: int) -> list[dict]:
    from llama_cpp import Llama

    llm = Llama(model_path=gguf, n_threads=2, n_ctx=2048, verbose=False, seed=0)
    llm.create_chat_completion(chats[0], max_tokens=8, temperature=0.0)
    runs = []
    for chat in chats:
        llm.reset()  # no prefix reuse between prompts, as the lanes runs use fresh salts
        start = time.perf_counter()
        first = None
        tokens = 0
        for chunk in llm.create_chat_completion(chat, max_tokens=new, temperature=0.0, stream=True):
            if chunk["choices"][0]["delta"].get("content"):
                tokens += 1
                first = first or time.perf_counter()
        end = time.perf_counter()
        runs.append(
            {
                "tokens": tokens,
                "seconds": end - start,
                "decode_tok_s": (tokens - 1) / (end - first) if first and tokens > 1 else None,
            }
        )
    return runs


def run_child(name: str, args, python: str) -> dict:
    cmd = [python, "-m", "bench.cpu.llamacpp", "--child", name, "--gguf", args.gguf]
    cmd += ["--prompts", str(args.prompts), "--new", str(args.new)]
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{name} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-python", default=None, help="a python with llama-cpp-python")
    ap.add_argument("--gguf", default=None, help="default: the default model's GGUF")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "cpu-vs-llamacpp.json"))
    args = ap.parse_args()
    chats = prompts(args.prompts)
    if args.child is not None:  # one configuration, in this process
        if args.child == "llama.cpp":
            runs = child_llama(args.gguf, chats, args.new)
        else:
            runs = child_lanes(args.gguf, CONFIGS[args.child], chats, args.new)
        print(json.dumps({"runs": runs, "peak_rss_mib": peak_rss_mib()}))
        return
    if args.gguf is None:
        from lanes.models.resolve import default_gguf

        args.gguf = str(default_gguf())
    names = [n for n in CONFIGS if CONFIGS[n] is not None or args.llama_python]
    results = {n: {"runs": [], "peak_rss_mib": []} for n in names}
    for p in range(args.passes):
        for name in names:
            python = args.llama_python if CONFIGS[name] is None else sys.executable
            got = run_child(name, args, python)
            results[name]["runs"] += got["runs"]
            results[name]["peak_rss_mib"].append(got["peak_rss_mib"])
            print(f"pass {p} {name}: {[round(r['tokens'] / r['seconds'], 1) for r in got['runs']]}",
                  flush=True)  # fmt: skip
    rows = {}
    for name, r in results.items():
        rows[name] = {
            "tok_s": statistics.median(x["tokens"] / x["seconds"] for x in r["runs"]),
            "decode_tok_s": statistics.median(
                x["decode_tok_s"] for x in r["runs"] if x["decode_tok_s"]
            ),
            "tokens": statistics.median(x["tokens"] for x in r["runs"]),
            "peak_rss_mib": max(r["peak_rss_mib"]),
            "runs": r["runs"],
        }
    base = rows.get("llama.cpp", {}).get("tok_s")
    print(f"{'configuration':44} {'tok/s':>7} {'decode':>7} {'vs llama.cpp':>13} {'peak RSS':>9}")
    for name, r in rows.items():
        ratio = f"{r['tok_s'] / base:.2f}x" if base else "-"
        print(
            f"{name:44} {r['tok_s']:7.1f} {r['decode_tok_s']:7.1f} {ratio:>13} "
            f"{r['peak_rss_mib']:7.0f} MiB"
        )
    report = {
        "machine": f"{os.cpu_count()} cores",
        "gguf": args.gguf,
        "batch": 1,
        "max_new_tokens": args.new,
        "prompts": len(chats),
        "passes": args.passes,
        "configurations": rows,
    }
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
