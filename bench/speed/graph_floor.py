"""The floor a graph-replayed forward sets with no host work at all: a captured decode or verify
graph replayed back to back (one synchronize at the end). For batch-1 decode it is set beside an
engine step (overlapped) of the same bucket: if the two match, what keeps the GPU from being
100% busy in steady decode is inside the graph (the gaps between its ~400-600 kernels), not the
host. The verify (1 lane x 5 tokens) and 1B-drafter buckets give the floor of a speculative
round: verify + k drafter steps.

    python -m bench.speed.graph_floor [--out FILE] [--replays 300]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from bench.shapes import LLAMA_31_8B, LLAMA_32_1B, SMOLLM2_135M, random_checkpoint, synthetic_prompt
from lanes import EngineConfig, SamplingParams, build_engine


def replay_ms(graph, replays: int) -> float:
    runs = []
    for _ in range(3):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
        runs.append((time.perf_counter() - start) / replays)
    return statistics.median(runs) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results/graph-floor-h200.json")
    ap.add_argument("--replays", type=int, default=300)
    args = ap.parse_args()
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    config = EngineConfig(device="cuda", kv_cache_bytes=8 * 2**30, prompt_cache_bytes=0)
    cases = (
        ("smollm2-135m", SMOLLM2_135M, [(1, 1)]),
        ("llama-3.2-1b", LLAMA_32_1B, [(1, 1)]),
        ("llama-3.1-8b", LLAMA_31_8B, [(1, 1), (1, 5), (64, 1)]),
    )
    for name, shape, buckets in cases:
        engine = build_engine(checkpoint=random_checkpoint(shape, "cuda"), config=config)
        prompt = synthetic_prompt(shape.vocab_size, 128, 3)
        params = SamplingParams(max_tokens=args.replays + 1, ignore_eos=True)
        steps = []
        for _ in range(3):
            (out,) = engine.generate([prompt], params)
            t = out.token_times
            steps.append((t[-1] - t[0]) / (len(t) - 1))
        graphs = engine.runner.graphs
        row = {"engine_step_ms bs1": statistics.median(steps) * 1e3}
        for bucket in buckets:
            if bucket not in graphs.graphs:
                graphs.graphs[bucket] = graphs._capture(*bucket)
            row[f"replay_only_ms lanes={bucket[0]} tokens={bucket[1]}"] = replay_ms(
                graphs.graphs[bucket].graph, args.replays
            )
        report[name] = row
        print(name, json.dumps(row), flush=True)
        del engine, graphs
        torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
