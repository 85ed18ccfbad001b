"""Decode rounds on random-weight models of real shapes, exact mode with CUDA graphs: batch-1
decode (SmolLM2-135M and Llama-3.1-8B shapes, 128-token prompt, 256 new tokens) and 64 lanes
(8B shape, 512-token prompts, 256 new tokens), with the wall time of steady decode rounds.
Uses only the public Engine API, so the same script measures an older tree (before/after runs).

    python -m bench.speed.rounds [--out FILE] [--repeats 3] [--label NAME]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from bench.shapes import LLAMA_31_8B, SMOLLM2_135M, random_checkpoint, synthetic_prompt
from lanes import Engine, EngineConfig, SamplingParams, build_engine


def batch1(engine: Engine, vocab: int, new: int, seed: int) -> float:
    prompt = synthetic_prompt(vocab, 128, seed)
    params = SamplingParams(max_tokens=new, ignore_eos=True)
    (out,) = engine.generate([prompt], params, cache_salt=f"b{seed}")
    t = out.token_times
    return (len(t) - 1) / (t[-1] - t[0])


def lanes64(engine: Engine, vocab: int, new: int, seed: int) -> dict:
    prompts = [synthetic_prompt(vocab, 512, 1000 * seed + i) for i in range(64)]
    params = SamplingParams(max_tokens=new, ignore_eos=True)
    first = engine.metrics.num_rounds
    start = time.perf_counter()
    outs = engine.generate(prompts, params, cache_salt=f"c{seed}")
    wall = time.perf_counter() - start
    rounds = list(engine.metrics.recent)[-(engine.metrics.num_rounds - first) :]
    widest = max(r.decode_tokens for r in rounds if r.prefill_tokens == 0)
    steady = [r for r in rounds if r.prefill_tokens == 0 and r.decode_tokens == widest]
    return {
        "output_tok_s": sum(len(o.token_ids) for o in outs) / wall,
        "steady_round_ms": statistics.median(r.seconds + r.host_seconds for r in steady) * 1e3,
        "steady_rounds": len(steady),
        "steady_decode_tokens": widest,
        "rounds": len(rounds),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results/rounds-h200.json")
    ap.add_argument("--label", default="")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=256)
    args = ap.parse_args()
    report = {
        "label": args.label,
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
    }
    base = dict(device="cuda", kv_cache_bytes=24 * 2**30, prompt_cache_bytes=0, max_lanes=64)
    for name, shape in (("smollm2-135m", SMOLLM2_135M), ("llama-3.1-8b", LLAMA_31_8B)):
        engine = build_engine(
            checkpoint=random_checkpoint(shape, "cuda"), config=EngineConfig(**base)
        )
        runs = [
            batch1(engine, shape.vocab_size, args.new_tokens, i) for i in range(args.repeats + 1)
        ]
        report[f"{name} bs1 tok/s"] = {"median": statistics.median(runs[1:]), "runs": runs[1:]}
        print(name, "bs1", round(report[f"{name} bs1 tok/s"]["median"], 1), flush=True)
        if name == "llama-3.1-8b":
            lanes64(engine, shape.vocab_size, 16, 99)  # warm-up: captures the 64-lane graphs
            runs64 = [lanes64(engine, shape.vocab_size, args.new_tokens, i) for i in range(2)]
            report["llama-3.1-8b c64"] = {
                "output_tok_s": statistics.median(r["output_tok_s"] for r in runs64),
                "steady_round_ms": statistics.median(r["steady_round_ms"] for r in runs64),
                "runs": runs64,
            }
            print("c64", report["llama-3.1-8b c64"], flush=True)
        del engine
        torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
