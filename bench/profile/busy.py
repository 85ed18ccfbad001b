"""How busy the GPU is in steady decode: a torch.profiler window over engine steps once every lane
decodes; device time = the union of the CUDA kernel intervals in the window, wall = host clock
around the steps (synchronized). Exact mode, CUDA graphs, random weights of real shapes.

    python -m bench.profile.busy [--out FILE] [--steps 30]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from bench.shapes import LLAMA_31_8B, SMOLLM2_135M, random_checkpoint, synthetic_prompt
from lanes import Engine, EngineConfig, SamplingParams, build_engine
from lanes.lane import LaneState


def settle(engine: Engine, vocab: int, lanes: int, prompt_len: int, steps: int) -> None:
    """Start `lanes` requests and step until every lane decodes (and a few steps more, so the
    graphs of this bucket are captured); each has room for `steps` more tokens."""
    params = SamplingParams(max_tokens=steps + 40, ignore_eos=True)
    for i in range(lanes):
        engine.submit(synthetic_prompt(vocab, prompt_len, 7000 + i), params)
    while engine.waiting or any(x.state is not LaneState.DECODE for x in engine.running):
        engine.step()
    for _ in range(5):
        engine.step()


def kernel_spans(engine: Engine, steps: int) -> tuple[float, list[tuple[float, float]]]:
    """`steps` engine steps under torch.profiler: host wall seconds (synchronized) and the
    CUDA kernels' (start, end) in microseconds, sorted."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            engine.step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    kernels = sorted(
        (e.time_range.start, e.time_range.end)
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA
    )
    return wall, kernels


def busy(engine: Engine, vocab: int, lanes: int, prompt_len: int, steps: int) -> dict:
    settle(engine, vocab, lanes, prompt_len, steps)
    wall, kernels = kernel_spans(engine, steps)
    covered, end = 0.0, float("-inf")
    small_gaps = large_gaps = 0.0  # idle between kernels: < 20 µs (inside a graph), longer
    num_large = 0
    for a, b in kernels:  # union of intervals, in microseconds
        if end > float("-inf") and a > end:
            if a - end < 20.0:
                small_gaps += a - end
            else:
                large_gaps += a - end
                num_large += 1
        if b > end:
            covered += b - max(a, end)
            end = b
    while engine.has_work():
        engine.step()
    return {
        "lanes": lanes,
        "context": prompt_len,
        "wall_ms_per_step": wall / steps * 1e3,
        "device_ms_per_step": covered / steps / 1e3,
        "gpu_busy": covered / 1e6 / wall,
        "device_events_per_step": len(kernels) / steps,
        # where the idle time is: many short gaps between kernels (a graph's own launches) or
        # few long ones (the GPU waiting for the host)
        "idle_ms_per_step_gaps_under_20us": small_gaps / steps / 1e3,
        "idle_ms_per_step_gaps_over_20us": large_gaps / steps / 1e3,
        "gaps_over_20us_per_step": num_large / steps,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results/busy-h200.json")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--overlap", nargs="+", default=["off", "on"], choices=["off", "on"])
    ap.add_argument("--shapes", nargs="+", default=["smollm2-135m", "llama-3.1-8b"])
    args = ap.parse_args()
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    base = dict(device="cuda", kv_cache_bytes=24 * 2**30, prompt_cache_bytes=0, max_lanes=64)
    for name, shape, cases in (
        ("smollm2-135m", SMOLLM2_135M, [(1, 128)]),
        ("llama-3.1-8b", LLAMA_31_8B, [(1, 128), (64, 700)]),
    ):
        if name not in args.shapes:
            continue
        ckpt = random_checkpoint(shape, "cuda")
        for overlap in args.overlap:
            engine = build_engine(
                checkpoint=ckpt, config=EngineConfig(**base, overlap=overlap == "on")
            )
            for lanes, ctx in cases:
                r = busy(engine, shape.vocab_size, lanes, ctx, args.steps)
                key = f"{name} lanes={lanes} overlap={overlap}"
                report[key] = r
                print(key, json.dumps(r), flush=True)
            del engine
            torch.cuda.empty_cache()
        del ckpt
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
