"""Where a c64 run's GPU time goes, by kind of round: one c64 run (64 requests, 512-token prompts,
256 new tokens; bench/speed/c64.py's engine) under torch.profiler, every engine step a window.
Each step is put in a kind by the round records it adds (prompt, mixed, planned decode,
overlapped decode); per kind: steps, wall seconds, device-busy seconds (the union of kernel
intervals inside the steps' windows), kernels, and the host's CUDA runtime calls (synchronizes,
copies) — what the GPU waited for between kernels.

    python -m bench.profile.rounds [--new 256] [--out FILE]
"""

from __future__ import annotations

import argparse
import bisect
import json
import time
from collections import Counter
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from bench.shapes import LLAMA_31_8B, synthetic_prompt
from bench.speed.c64 import c64_engine, split_rounds
from lanes import SamplingParams

_SYNCS = ("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize")


def kind_of(records) -> str:
    if not records:
        return "none"
    kinds = split_rounds(records)
    return "+".join(sorted(kinds))


def union_inside(spans: list[tuple[float, float]], a: float, b: float) -> tuple[float, int]:
    """Covered microseconds of sorted kernel spans clipped to [a, b), and how many start there."""
    i = bisect.bisect_left(spans, (a, a))
    covered, end, n = 0.0, a, 0
    # a kernel that began before a and runs into the window counts from a
    j = i - 1
    while j >= 0 and spans[j][1] > a:
        end = max(end, min(spans[j][1], b))
        j -= 1
    covered += end - a
    while i < len(spans) and spans[i][0] < b:
        s, e = spans[i]
        n += 1
        e = min(e, b)
        if e > end:
            covered += e - max(s, end)
            end = e
        i += 1
    return covered, n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--lanes", type=int, default=64)
    ap.add_argument("--out", default="bench/results/trace-rounds-h200.json")
    args = ap.parse_args()
    shape = LLAMA_31_8B
    engine = c64_engine()
    params = SamplingParams(max_tokens=args.new, ignore_eos=True)
    warm = [synthetic_prompt(shape.vocab_size, 512, 5000 + i) for i in range(args.lanes)]
    engine.generate(warm, params, cache_salt="warm")  # a whole run first: every bucket captured
    prompts = [synthetic_prompt(shape.vocab_size, 512, 6000 + j) for j in range(args.lanes)]
    for p in prompts:
        engine.submit(p, params, cache_salt="traced")
    windows = []  # (start_us, end_us, kind) on the profiler's clock
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        while engine.has_work():
            before = engine.metrics.num_rounds
            with torch.profiler.record_function("lanes_step"):
                engine.step()
            added = engine.metrics.num_rounds - before
            records = list(engine.metrics.recent)[-added:] if added else []
            windows.append(kind_of(records))
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    events = prof.events()
    steps = sorted((e.time_range.start, e.time_range.end) for e in events if e.name == "lanes_step")
    kernels = sorted(
        (e.time_range.start, e.time_range.end)
        for e in events
        if e.device_type == torch.autograd.DeviceType.CUDA
    )
    runtime = sorted(
        (e.time_range.start, e.name, e.time_range.end - e.time_range.start)
        for e in events
        if e.name.startswith("cuda") and e.device_type == torch.autograd.DeviceType.CPU
    )
    report: dict = {
        "gpu": torch.cuda.get_device_name(),
        "wall_s": wall,
        "output_tok_s": args.lanes * args.new / wall,
        "steps": len(steps),
        "by_kind": {},
    }
    starts = [r[0] for r in runtime]
    for (a, b), kind in zip(steps, windows, strict=False):
        k = report["by_kind"].setdefault(
            kind,
            {"steps": 0, "wall_s": 0.0, "busy_s": 0.0, "kernels": 0, "runtime": Counter()},
        )
        covered, n = union_inside(kernels, a, b)
        k["steps"] += 1
        k["wall_s"] += (b - a) / 1e6
        k["busy_s"] += covered / 1e6
        k["kernels"] += n
        lo, hi = bisect.bisect_left(starts, a), bisect.bisect_left(starts, b)
        for _, name, dur in runtime[lo:hi]:
            if name in _SYNCS or "Memcpy" in name:
                k["runtime"][name + " n"] += 1
                k["runtime"][name + " ms"] += dur / 1e3
    for k in report["by_kind"].values():
        k["busy_share"] = k["busy_s"] / k["wall_s"] if k["wall_s"] else None
        k["runtime"] = {n: round(v, 2) for n, v in sorted(k["runtime"].items())}
    print(json.dumps(report, indent=1), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
