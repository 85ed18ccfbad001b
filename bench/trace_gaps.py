"""What the GPU waits for in steady decode: a torch.profiler trace (CPU and CUDA) over engine
steps once every lane decodes; for each idle gap over 20 µs between kernels, the host ops that
were running when it began (what the host was busy with while the GPU had nothing queued).

    python -m bench.trace_gaps [--shape llama-3.1-8b] [--lanes 64] [--context 700] [--steps 10]
"""

from __future__ import annotations

import argparse
import collections
import json
import time

import torch
from torch.profiler import ProfilerActivity, profile

from bench.profile_busy import settle
from bench.shapes import SHAPES, random_checkpoint
from lanes import EngineConfig, build_engine


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="llama-3.1-8b", choices=sorted(SHAPES))
    ap.add_argument("--lanes", type=int, default=64)
    ap.add_argument("--context", type=int, default=700)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--overlap", choices=["on", "off"], default="on")
    ap.add_argument("--out", default="bench/results/trace-gaps-h200.json")
    args = ap.parse_args()
    shape = SHAPES[args.shape]
    config = EngineConfig(
        device="cuda",
        kv_cache_bytes=24 * 2**30,
        prompt_cache_bytes=0,
        max_lanes=64,
        overlap=args.overlap == "on",
    )
    engine = build_engine(checkpoint=random_checkpoint(shape, "cuda"), config=config)
    settle(engine, shape.vocab_size, args.lanes, args.context, args.steps + 80)
    for _ in range(40):  # past every lane's first steps: no graph capture inside the window
        engine.step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for _ in range(args.steps):
            engine.step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    events = prof.events()
    kernels = sorted(
        (e.time_range.start, e.time_range.end)
        for e in events
        if e.device_type == torch.autograd.DeviceType.CUDA
    )
    host = [
        (e.time_range.start, e.time_range.end, e.name)
        for e in events
        if e.device_type == torch.autograd.DeviceType.CPU
    ]
    gaps, end, covered = [], None, 0.0
    for a, b in kernels:
        if end is not None and a - end > 20.0:
            gaps.append((end, a))
        covered += b - a if end is None else max(0.0, b - max(a, end))
        end = b if end is None else max(end, b)
    # host ops (innermost names count too) overlapping each gap, weighted by the overlap
    blame: collections.Counter = collections.Counter()
    for g0, g1 in gaps:
        for h0, h1, name in host:
            overlap = min(g1, h1) - max(g0, h0)
            if overlap > 0:
                blame[name] += overlap
    report = {
        "shape": args.shape,
        "lanes": args.lanes,
        "overlap": args.overlap,
        "steps": args.steps,
        "wall_ms_per_step": wall / args.steps * 1e3,  # under the profiler: a little slower
        "device_ms_per_step": covered / args.steps / 1e3,
        "gaps_over_20us_per_step": len(gaps) / args.steps,
        "gap_ms_per_step": sum(b - a for a, b in gaps) / args.steps / 1e3,
        "host_ops_during_gaps_ms_per_step": {
            name: round(us / args.steps / 1e3, 4) for name, us in blame.most_common(40)
        },
    }
    print(json.dumps(report, indent=1))
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
