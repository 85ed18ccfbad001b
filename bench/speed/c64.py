"""Where a c64 run's time goes, round by round: 64 concurrent requests, 512-token prompts, 256 new
tokens (bench_engine's c64 section), repeated on one engine. Each run is split by the engine's
own round records (lanes.metrics.RoundRecord) into prompt rounds, mixed rounds, planned decode
rounds and overlapped decode rounds, with their wall and host seconds, so runs of the same
workload that differ in speed can be told apart.

    python -m bench.speed.c64 [--runs 4] [--seeded-runs 1] [--prefill-share S]
        [--no-prefill-bursts] [--out FILE]

Random bf16 weights of the Llama-3.1-8B shape, exact mode, CUDA graphs, the engine settings of
bench_engine (48 GiB of KV, 8,192 tokens per round, 512-token prefill chunks).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

import torch

from bench.shapes import LLAMA_31_8B, id_tokenizer, random_checkpoint, synthetic_prompt
from lanes import EngineConfig, SamplingParams, build_engine


def split_rounds(records) -> dict:
    """Seconds, host seconds and counts of each kind of round."""
    kinds: dict[str, dict] = {}
    for r in records:
        if r.prefill_tokens and r.decode_tokens:
            kind = "mixed"
        elif r.prefill_tokens:
            kind = "prompt"
        elif r.overlapped:
            kind = "decode_overlapped"
        else:
            kind = "decode_planned"
        k = kinds.setdefault(kind, {"rounds": 0, "seconds": 0.0, "host_seconds": 0.0, "max": 0.0})
        k["rounds"] += 1
        k["seconds"] += r.seconds
        k["host_seconds"] += r.host_seconds
        k["max"] = max(k["max"], r.seconds)
    return kinds


def c64_engine(prefill_share: float = EngineConfig.prefill_share, bursts: bool = True):
    """The c64 engine: random bf16 weights of the Llama-3.1-8B shape on the GPU, bench_engine's
    settings (48 GiB of KV, 8,192 tokens per round, 512-token prefill chunks)."""
    shape = LLAMA_31_8B
    ckpt = random_checkpoint(shape, "cuda", tokenizer=id_tokenizer(shape.vocab_size))
    config = EngineConfig(
        device="cuda",
        kv_cache_bytes=48 * 2**30,
        prompt_cache_bytes=0,
        max_lanes=64,
        max_tokens_per_round=8192,
        prefill_chunk=512,
        prefill_share=prefill_share,
        prefill_bursts=bursts,
    )
    return build_engine(checkpoint=ckpt, config=config)


def one_run(engine, prompts, params, salt: str) -> dict:
    before = engine.metrics.num_rounds
    start = time.perf_counter()
    outs = engine.generate(prompts, params, cache_salt=salt)
    wall = time.perf_counter() - start
    new_rounds = engine.metrics.num_rounds - before
    records = list(engine.metrics.recent)[-new_rounds:]
    first = [o.token_times[0] - start for o in outs]
    return {
        "output_tok_s": sum(len(o.token_ids) for o in outs) / wall,
        "wall_s": wall,
        "rounds": new_rounds,
        "first_token_s": {"min": min(first), "median": statistics.median(first), "max": max(first)},
        "by_kind": split_rounds(records),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--seeded-runs", type=int, default=1)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--prefill-share", type=float, default=EngineConfig.prefill_share)
    ap.add_argument(
        "--prefill-bursts", action=argparse.BooleanOptionalAction, default=True
    )  # lanes/prompt_burst.py
    ap.add_argument("--out", default="bench/results/c64-rounds-h200.json")
    args = ap.parse_args()
    shape = LLAMA_31_8B
    engine = c64_engine(args.prefill_share, args.prefill_bursts)
    greedy = SamplingParams(max_tokens=args.new, ignore_eos=True)
    seeded = dataclasses.replace(greedy, temperature=0.7, top_p=0.9, seed=5)
    engine.generate(
        [synthetic_prompt(shape.vocab_size, 512, 5000 + i) for i in range(4)],
        greedy,
        cache_salt="warm",
    )
    report = {
        "gpu": torch.cuda.get_device_name(),
        "prefill_share": args.prefill_share,
        "prefill_bursts": args.prefill_bursts,
        "runs": [],
    }
    plan = [("greedy", greedy)] * args.runs + [("seeded", seeded)] * args.seeded_runs
    for i, (label, params) in enumerate(plan):
        prompts = [synthetic_prompt(shape.vocab_size, 512, 6000 + 64 * i + j) for j in range(64)]
        run = {"sampling": label, **one_run(engine, prompts, params, f"c64-{i}")}
        report["runs"].append(run)
        kinds = {
            k: f"{v['rounds']} rounds {v['seconds']:.2f} s (host {v['host_seconds']:.2f}, "
            f"max {v['max'] * 1e3:.0f} ms)"
            for k, v in run["by_kind"].items()
        }
        print(
            f"run {i} {label}: {run['output_tok_s']:.0f} tok/s, {run['wall_s']:.2f} s, "
            f"first tokens {run['first_token_s']['median']:.2f} s (max "
            f"{run['first_token_s']['max']:.2f}); {kinds}",
            flush=True,
        )
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
