"""Where a batch-1 decode step's time goes: the target forward (graph replay or eager), sampling,
and the engine's own host work. Prints per-step medians in microseconds.

    python -m bench.profile.decode [--shape smollm2-135m] [--graphs 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from bench.shapes import SHAPES, random_checkpoint
from lanes import EngineConfig, SamplingParams, build_engine


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="smollm2-135m")
    ap.add_argument("--graphs", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=128)
    args = ap.parse_args()
    cfg = SHAPES[args.shape]
    engine = build_engine(
        checkpoint=random_checkpoint(cfg, "cuda"),
        config=EngineConfig(device="cuda", cuda_graphs=bool(args.graphs), kv_cache_bytes=2**31),
    )
    timings: dict[str, list[float]] = {"forward": [], "sample": []}
    runner_execute = engine.runner.execute

    def timed(name, fn):
        def wrapper(*a, **kw):
            torch.cuda.synchronize()
            t = time.perf_counter()
            out = fn(*a, **kw)
            torch.cuda.synchronize()
            timings[name].append(time.perf_counter() - t)
            return out

        return wrapper

    engine.runner.execute = timed("forward", runner_execute)
    import lanes.speculation as spec

    spec.sample_row = timed("sample", spec.sample_row)
    steps = []
    for rep in range(2):
        engine.add_request(
            list(range(3, 131)), SamplingParams(max_tokens=args.tokens, ignore_eos=True)
        )
        while engine.has_work():
            t = time.perf_counter()
            engine.step()
            steps.append(time.perf_counter() - t)
        if rep == 0:  # the first request warms up (compiles, captures)
            steps.clear()
            for values in timings.values():
                values.clear()
    med = {k: statistics.median(v) * 1e6 for k, v in timings.items() if v}
    step = statistics.median(steps) * 1e6
    print(
        f"{args.shape} graphs={args.graphs} replays={getattr(engine.runner.graphs, 'num_replays', 0)}"
    )
    print(
        f"step {step:.0f} us | forward {med.get('forward', 0):.0f} us | sample {med.get('sample', 0):.0f} us | other host {step - med.get('forward', 0) - med.get('sample', 0):.0f} us | {1e6 / step:.0f} tok/s"
    )


if __name__ == "__main__":
    main()
