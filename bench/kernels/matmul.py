"""Decode GEMV/GEMM times per weight shape: lanes' batch-invariant matmul (its own plan, or a
forced tile width and split) against cuBLAS, CUDA-event timed over CUDA-graph replays, medians.

    python -m bench.kernels.matmul [--rows 1,16,64] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import torch.nn.functional as F

from bench.kernels.check import LAYERS_8B, LAYERS_SMOLLM2
from lanes.kernels import matmul


def event_us(run, repeats: int) -> float:
    """Median microseconds of run(), CUDA-event timed, over `repeats` calls after one warm-up."""
    run()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def graph_us(fn, replays: int = 50, repeats: int = 5) -> float:
    """Median microseconds per call of fn, captured `replays` times in one CUDA graph."""
    fn()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(replays):
            fn()
    return event_us(graph.replay, repeats) / replays


def forced(plan):
    """matmul with plan_for replaced by a fixed plan (the kernel takes whatever it is given)."""
    original = matmul.plan_for

    def run(*args, **kwargs):
        matmul.plan_for = lambda n, k, target, wide=False: plan
        try:
            return matmul.matmul(*args, **kwargs)
        finally:
            matmul.plan_for = original

    return run


def shape_times(n: int, k: int, rows: list[int], target: int) -> dict:
    w = torch.randn((n, k), device="cuda", dtype=torch.bfloat16) * k**-0.5
    plan = matmul.plan_for(n, k, target, matmul.wide_steps(w.dtype, w.device))
    splits = [s for s in (1, 2, 4, 8) if s != plan.split and (k // matmul.BLOCK_K) % s == 0]
    out = {}
    for m in rows:
        plain = torch.randn((m, k), device="cuda", dtype=torch.bfloat16)
        row = {"plan": [plan.block_n, plan.split], "weight_MB": n * k * 2 / 1e6}
        row["cublas_us"] = graph_us(lambda p=plain: F.linear(p, w))
        row["plan_us"] = graph_us(lambda p=plain: matmul.matmul(p, w))
        for split in splits:
            run = forced(matmul.Plan(plan.block_n, split))
            row[f"split{split}_us"] = graph_us(lambda r=run, p=plain: r(p, w))
        row["plan_GB_s"] = n * k * 2 / row["plan_us"] / 1e3
        out[m] = row
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,16,64")
    ap.add_argument("--out", default="bench/results/matmul-h200.json")
    args = ap.parse_args()
    target = matmul.target_programs(torch.device("cuda"))
    rows = [int(r) for r in args.rows.split(",")]
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": {}}
    for name, (n, k) in {**LAYERS_8B, **LAYERS_SMOLLM2}.items():
        for m, row in shape_times(n, k, rows, target).items():
            report["rows"][f"{name} m={m}"] = row
            short = {a: round(b, 1) if isinstance(b, float) else b for a, b in row.items()}
            print(f"{name} m={m}", json.dumps(short), flush=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
