"""Where the device time goes, kernel by kernel: torch.profiler over one long prompt's prefill
and over steady batch-1 decode steps, the CUDA kernels' time summed by kernel name. Exact mode,
CUDA graphs, random bf16 weights of real shapes (a prefill for each shape but SmolLM2's).

    python -m bench.profile.kernels [--shapes llama-3.1-8b qwen3.5-2b-like] [--prefill 8192]
        [--steps 30] [--bits 4] [--lanes 1 64] [--out FILE]

--bits: the projections and LM head held as MLX affine codes of that width (group 64), served
packed (issue 19: where a packed decode step's time goes).

Under programmatic dependent launch (kernels/common.pdl_launch) a kernel's span includes the time
its programs waited for the previous kernel: run with LANES_PDL=0 for per-kernel device times.
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from bench.profile.busy import settle
from bench.shapes import SHAPES, random_checkpoint, random_packed_checkpoint, synthetic_prompt
from lanes import EngineConfig, SamplingParams, build_engine


def by_name(prof, per: int) -> dict:
    """Kernel µs and launches per `per` (a step, or 1 for a whole prefill), largest first."""
    total, count = collections.Counter(), collections.Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            name = e.name[:60]
            total[name] += e.time_range.end - e.time_range.start
            count[name] += 1
    rows = {n: {"us": total[n] / per, "launches": count[n] / per} for n, _ in total.most_common()}
    return {"device_ms": sum(total.values()) / per / 1e3, "kernels": rows}


def prefill_profile(engine, vocab: int, length: int) -> dict:
    params = SamplingParams(max_tokens=1, ignore_eos=True)
    engine.generate([synthetic_prompt(vocab, length, 1)], params, cache_salt="warm")
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        engine.generate([synthetic_prompt(vocab, length, 2)], params, cache_salt="timed")
        torch.cuda.synchronize()
    return by_name(prof, 1)


def decode_profile(engine, vocab: int, steps: int, lanes: int = 1, context: int = 128) -> dict:
    settle(engine, vocab, lanes, context, steps)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            engine.step()
        torch.cuda.synchronize()
    while engine.has_work():
        engine.step()
    return by_name(prof, steps)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefill", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument(
        "--shapes", nargs="+", default=["smollm2-135m", "llama-3.1-8b"], choices=sorted(SHAPES)
    )
    ap.add_argument("--bits", type=int, default=0, help="packed affine codes of this width")
    ap.add_argument(
        "--lanes", type=int, nargs="+", default=[1], help="decode batches (> 1: 700-token contexts)"
    )
    ap.add_argument("--out", default="bench/results/profile-kernels-h200.json")
    args = ap.parse_args()
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    base = dict(
        device="cuda",
        kv_cache_bytes=12 * 2**30,
        prompt_cache_bytes=0,
        prefill_chunk=32768,
        max_tokens_per_round=32768,
        max_lanes=max(64, *args.lanes),
    )
    for name in args.shapes:
        shape = SHAPES[name]
        ckpt = (
            random_packed_checkpoint(shape, "cuda", bits=args.bits)
            if args.bits
            else random_checkpoint(shape, "cuda")
        )
        engine = build_engine(checkpoint=ckpt, config=EngineConfig(**base))
        for lanes in args.lanes:
            report[f"{name} decode batch {lanes}"] = decode_profile(
                engine, shape.vocab_size, args.steps, lanes, 128 if lanes == 1 else 700
            )
        if name != "smollm2-135m" and args.prefill:
            report[f"{name} prefill {args.prefill}"] = prefill_profile(
                engine, shape.vocab_size, args.prefill
            )
        del engine
        torch.cuda.empty_cache()
    for key, value in report.items():
        if isinstance(value, dict):
            top = list(value["kernels"].items())[:8]
            print(key, f"{value['device_ms']:.3f} ms", json.dumps(top), flush=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
