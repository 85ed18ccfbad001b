"""What the GPU waits for: a torch.profiler trace (CPU and CUDA) over a window of engine work;
for each idle gap over 20 µs between kernels, the host ops that were running while it lasted
(what the host was busy with while the GPU had nothing queued).

The window is either steady decode (engine steps once every lane decodes) or, with `--prefill N`,
one N-token prompt in a single chunk up to its first token (bench_speed's prefill: TTFT against
the kernels' own time); each gap is then also listed with its offset from the request's start.

    python -m bench.profile.gaps [--shape llama-3.1-8b] [--lanes 64] [--context 700] [--steps 10]
    python -m bench.profile.gaps --prefill 8192 [--shape llama-3.1-8b]
"""

from __future__ import annotations

import argparse
import collections
import json
import time

import torch
from torch.profiler import ProfilerActivity, profile

from bench.profile.busy import settle
from bench.shapes import SHAPES, random_checkpoint
from bench.speed.decode_prefill import prefill_s
from lanes import EngineConfig, build_engine


def decode_window(engine, shape, args) -> tuple[profile, float, float]:
    """Profile `args.steps` steady decode steps; (profile, wall seconds, units)."""
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
    return prof, wall, args.steps


def prefill_window(engine, shape, args) -> tuple[profile, float, float]:
    """Profile one `args.prefill`-token prompt to its first token, after two warm-up prompts
    of the same length (Triton compiles, the allocator grows); (profile, TTFT seconds, 1)."""
    for i in range(2):
        prefill_s(engine, shape.vocab_size, args.prefill, 100 + i)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        ttft = prefill_s(engine, shape.vocab_size, args.prefill, 999)
        torch.cuda.synchronize()
    return prof, ttft, 1


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="llama-3.1-8b", choices=sorted(SHAPES))
    ap.add_argument("--lanes", type=int, default=64)
    ap.add_argument("--context", type=int, default=700)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--prefill", type=int, default=0, help="trace one prompt of this length")
    ap.add_argument("--overlap", choices=["on", "off"], default="on")
    ap.add_argument("--out", default="bench/results/trace-gaps-h200.json")
    args = ap.parse_args()
    shape = SHAPES[args.shape]
    chunk = dict(prefill_chunk=args.prefill, max_tokens_per_round=args.prefill)
    config = EngineConfig(
        device="cuda",
        kv_cache_bytes=24 * 2**30,
        prompt_cache_bytes=0,
        max_lanes=64,
        overlap=args.overlap == "on",
        **(chunk if args.prefill else {}),
    )
    engine = build_engine(checkpoint=random_checkpoint(shape, "cuda"), config=config)
    window = prefill_window if args.prefill else decode_window
    prof, wall, units = window(engine, shape, args)
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
    first_host = min(h0 for h0, _, _ in host)
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
    unit = "prompt" if args.prefill else "step"
    report = {
        "shape": args.shape,
        "lanes": 1 if args.prefill else args.lanes,
        "prefill": args.prefill,
        "overlap": args.overlap,
        "steps": args.steps,
        # under the profiler: a little slower; for --prefill the TTFT of the traced prompt
        f"wall_ms_per_{unit}": wall / units * 1e3,
        f"device_ms_per_{unit}": covered / units / 1e3,
        f"gaps_over_20us_per_{unit}": len(gaps) / units,
        f"gap_ms_per_{unit}": sum(b - a for a, b in gaps) / units / 1e3,
        f"host_ops_during_gaps_ms_per_{unit}": {
            name: round(us / units / 1e3, 4) for name, us in blame.most_common(40)
        },
    }
    if args.prefill:  # host time before the first kernel (planning, layout, copies), and where
        # in the prompt's time the gaps fall: ms from the first host op
        report["ms_before_first_kernel"] = (kernels[0][0] - first_host) / 1e3
        report["gaps_ms_at_offset"] = [
            [round((a - first_host) / 1e3, 3), round((b - a) / 1e3, 3)] for a, b in gaps
        ]
    print(json.dumps(report, indent=1))
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
