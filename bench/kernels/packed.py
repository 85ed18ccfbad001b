"""4-bit weights on the GPU (issue 19 item 4): batch-1 decode of one shape with bf16 weights and
with MLX-style 4-bit codes (random, bench.shapes.random_packed_checkpoint) served packed by the
Triton kernel, alternating, medians; the weight bytes each holds.

    python -m bench.kernels.packed [--shape llama-3.1-8b] [--repeats 3] [--new-tokens 256]
        [--bits 4] [--group 64] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from bench.shapes import SHAPES, random_checkpoint, random_packed_checkpoint
from bench.speed.decode_prefill import decode_tok_s
from lanes import EngineConfig, build_engine


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="llama-3.1-8b", choices=sorted(SHAPES))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--group", type=int, default=64)
    ap.add_argument("--out", default="bench/results/packed-h200.json")
    args = ap.parse_args()
    shape = SHAPES[args.shape]
    config = EngineConfig(device="cuda", kv_cache_bytes=8 * 2**30, prompt_cache_bytes=0)
    checkpoints = {
        "bf16": random_checkpoint(shape, "cuda"),
        f"{args.bits}-bit": random_packed_checkpoint(shape, "cuda", args.bits, args.group),
    }
    engines = {name: build_engine(checkpoint=c, config=config) for name, c in checkpoints.items()}
    runs: dict[str, list[float]] = {name: [] for name in engines}
    for r in range(args.repeats):  # alternating, so drift hits both alike
        for name, engine in engines.items():
            runs[name].append(decode_tok_s(engine, shape.vocab_size, args.new_tokens, 100 + r))
    report = {
        "gpu": torch.cuda.get_device_name(),
        "shape": args.shape,
        "batch": 1,
        "new_tokens": args.new_tokens,
        "group": args.group,
        "decode_tok_s": {n: statistics.median(v) for n, v in runs.items()},
        "runs": runs,
        "weight_bytes": {n: e.runner.decoder.weights.nbytes for n, e in engines.items()},
    }
    report["speedup"] = report["decode_tok_s"][f"{args.bits}-bit"] / report["decode_tok_s"]["bf16"]
    print(json.dumps(report, indent=1), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
