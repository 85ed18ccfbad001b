"""The floor a graph-replayed decode step sets with no host work at all: the batch-1 decode
graph replayed back to back (one synchronize at the end), against an engine step (overlapped)
of the same bucket. If the two match, what keeps the GPU from being 100% busy in steady decode
is inside the graph (the gaps between its ~400-500 kernels), not the host.

    python -m bench.graph_floor [--out FILE] [--replays 300]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from bench.shapes import LLAMA_31_8B, SMOLLM2_135M, random_checkpoint, synthetic_prompt
from lanes import EngineConfig, SamplingParams, build_engine


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results/graph-floor-h200.json")
    ap.add_argument("--replays", type=int, default=300)
    args = ap.parse_args()
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    config = EngineConfig(device="cuda", kv_cache_bytes=4 * 2**30, prompt_cache_bytes=0)
    for name, shape in (("smollm2-135m", SMOLLM2_135M), ("llama-3.1-8b", LLAMA_31_8B)):
        engine = build_engine(checkpoint=random_checkpoint(shape, "cuda"), config=config)
        prompt = synthetic_prompt(shape.vocab_size, 128, 3)
        params = SamplingParams(max_tokens=args.replays + 1, ignore_eos=True)
        steps = []
        for _ in range(3):
            (out,) = engine.generate([prompt], params)
            t = out.token_times
            steps.append((t[-1] - t[0]) / (len(t) - 1))
        graph = engine.runner.graphs.graphs[(1, 1)].graph
        replays = []
        for _ in range(3):
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(args.replays):
                graph.replay()
            torch.cuda.synchronize()
            replays.append((time.perf_counter() - start) / args.replays)
        row = {
            "engine_step_ms": statistics.median(steps) * 1e3,
            "replay_only_ms": statistics.median(replays) * 1e3,
        }
        row["step_over_replay"] = row["engine_step_ms"] / row["replay_only_ms"]
        report[f"{name} bs1"] = row
        print(name, json.dumps(row), flush=True)
        del engine
        torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
