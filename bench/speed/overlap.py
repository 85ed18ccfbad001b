"""Overlapped rounds on and off, in the same run on the same engine weights, alternating:
batch-1 greedy decode (SmolLM2-135M and Llama-3.1-8B shapes, 128-token prompt) and 64 lanes
(8B shape, 512-token prompts), random bf16 weights, exact mode, CUDA graphs. Every pair's tokens
and logprobs must be equal (the run stops otherwise).

    python -m bench.speed.overlap [--out FILE] [--pairs 3] [--new-tokens 256]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

import torch

from bench.shapes import LLAMA_31_8B, SMOLLM2_135M, random_checkpoint, synthetic_prompt
from lanes import EngineConfig, SamplingParams, build_engine


def run(engine, prompts, new: int, salt: str) -> tuple[float, list]:
    params = SamplingParams(max_tokens=new, ignore_eos=True)
    start = time.perf_counter()
    outs = engine.generate(prompts, params, cache_salt=salt)
    wall = time.perf_counter() - start
    if len(prompts) == 1:  # decode rate between the first and last token (prefill excluded)
        t = outs[0].token_times
        return (len(t) - 1) / (t[-1] - t[0]), outs
    return sum(len(o.token_ids) for o in outs) / wall, outs


def compare(engines: dict, prompts, new: int, pairs: int, label: str) -> dict:
    rates = {name: [] for name in engines}
    for name, engine in engines.items():  # warm-up: graphs captured, kernels compiled
        run(engine, prompts, min(new, 16), f"w{label}{name}")
    for i in range(pairs):
        outs = {}
        for name, engine in engines.items():
            rate, outs[name] = run(engine, prompts, new, f"{label}{i}{name}")
            rates[name].append(rate)
        a, b = ([(o.token_ids, o.logprobs) for o in outs[n]] for n in ("synchronous", "overlapped"))
        assert a == b, f"{label}: overlapped output differs from synchronous"
    row = {name: {"median": statistics.median(r), "runs": r} for name, r in rates.items()}
    row["ratio"] = row["overlapped"]["median"] / row["synchronous"]["median"]
    row["equal_outputs"] = True
    print(label, json.dumps({k: round(v["median"], 1) for k, v in row.items() if k in engines}),
          f"ratio {row['ratio']:.2f}", flush=True)  # fmt: skip
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results/overlap-h200.json")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--skip-c64", action="store_true")
    args = ap.parse_args()
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    base = EngineConfig(
        device="cuda", kv_cache_bytes=24 * 2**30, prompt_cache_bytes=0, max_lanes=64
    )
    for name, shape in (("smollm2-135m", SMOLLM2_135M), ("llama-3.1-8b", LLAMA_31_8B)):
        ckpt = random_checkpoint(shape, "cuda")
        engines = {
            "synchronous": build_engine(checkpoint=ckpt, config=dataclasses.replace(base, overlap=False)),
            "overlapped": build_engine(checkpoint=ckpt, config=dataclasses.replace(base, overlap=True)),
        }  # fmt: skip
        prompt = [synthetic_prompt(shape.vocab_size, 128, 5)]
        report[f"{name} bs1 tok/s"] = compare(
            engines, prompt, args.new_tokens, args.pairs, f"{name} bs1"
        )
        if name == "llama-3.1-8b" and not args.skip_c64:
            prompts = [synthetic_prompt(shape.vocab_size, 512, 100 + i) for i in range(64)]
            report[f"{name} c64 output tok/s"] = compare(
                engines, prompts, args.new_tokens, 2, f"{name} c64"
            )
            print(
                "overlapped rounds", engines["overlapped"].metrics.num_overlapped_rounds, flush=True
            )
        del engines, ckpt
        torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
