"""Serve a random-weight model of a real shape over HTTP, for bench_openai on a GPU machine with
no model weights (no network there):

    python -m bench.serving.serve_random --shape llama-3.1-8b --port 8000 [--drafter ngram]
"""

from __future__ import annotations

import argparse

import torch
import uvicorn

from bench.shapes import SHAPES, random_checkpoint
from lanes import EngineConfig, build_engine
from lanes.server import build_app


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="llama-3.1-8b", choices=sorted(SHAPES))
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--drafter", default="ngram")
    ap.add_argument("--kv-gib", type=float, default=40.0)
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = EngineConfig(
        device=device,
        drafter=args.drafter,
        kv_cache_bytes=int(args.kv_gib * 2**30),
        prompt_cache_bytes=int(args.kv_gib * 2**29),
        max_lanes=64,
        max_tokens_per_round=8192,
        prefill_chunk=2048,
    )
    engine = build_engine(checkpoint=random_checkpoint(SHAPES[args.shape], device), config=config)
    uvicorn.run(
        build_app(engine, args.shape), host="127.0.0.1", port=args.port, log_level="warning"
    )


if __name__ == "__main__":
    main()
