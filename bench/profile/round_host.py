"""Where the host's time goes in steady decode on the GPU: cProfile over engine steps once every
lane decodes (random weights of a real shape, exact mode, CUDA graphs, overlap as configured).
With overlap the host's work per round is the round's wall time whenever it exceeds the device's.

    python -m bench.profile.round_host [--shape smollm2-135m] [--lanes 1] [--steps 200]
        [--drafter llama-3.2-1b --acceptance 0.8 --k 4]

With --drafter, rounds verify replay drafts of the set acceptance that cost what the named
drafter's forwards cost (bench_engine's CostedReplay), as the speculative bench runs them.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import torch

from bench.shapes import SHAPES, random_checkpoint, synthetic_prompt
from lanes import EngineConfig, SamplingParams, build_engine
from lanes.lane import LaneState


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="smollm2-135m", choices=sorted(SHAPES))
    ap.add_argument("--lanes", type=int, default=1)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--overlap", choices=["on", "off"], default="on")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--drafter", default=None, choices=sorted(SHAPES))
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test of this script")
    ap.add_argument("--acceptance", type=float, default=0.8)
    ap.add_argument("--k", type=int, default=4)
    args = ap.parse_args()
    shape = SHAPES[args.shape]
    config = EngineConfig(
        device=args.device,
        kv_cache_bytes=(24 if args.device == "cuda" else 1) * 2**30,
        prompt_cache_bytes=0,
        max_lanes=max(16, args.lanes),
        overlap=args.overlap == "on",
        num_draft_tokens=args.k,
        adaptive_drafts=False,
    )
    ckpt = random_checkpoint(shape, args.device)
    engine = build_engine(checkpoint=ckpt, config=config)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    prompts = [synthetic_prompt(shape.vocab_size, args.context, 300 + i) for i in range(args.lanes)]
    new = args.steps * (args.k + 1 if args.drafter else 1) + 60
    params = SamplingParams(max_tokens=new, ignore_eos=True)
    if args.drafter:
        from bench.speed.engine import CostedReplay
        from lanes.drafter.model import ModelDrafter
        from lanes.drafter.replay import ReplayProposer

        outs = engine.generate(prompts, params, cache_salt="record")
        records = {tuple(p): o.token_ids for p, o in zip(prompts, outs, strict=True)}
        draft_ckpt = random_checkpoint(
            SHAPES[args.drafter], args.device, seed=1, tokenizer=ckpt.tokenizer
        )
        drafter = ModelDrafter(
            draft_ckpt, ckpt.tokenizer, config.replace(draft_kv_cache_bytes=2**31)
        )
        replay = ReplayProposer(records, args.acceptance, shape.vocab_size)
        engine.proposer = CostedReplay(replay, drafter)
    for p in prompts:
        engine.submit(p, params)
    while engine.waiting or any(x.state is not LaneState.DECODE for x in engine.running):
        engine.step()
    for _ in range(20):
        engine.step()
    sync()
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    for _ in range(args.steps):
        engine.step()
    profiler.disable()
    sync()
    wall = (time.perf_counter() - start) / args.steps
    label = f"{args.shape} lanes={args.lanes} overlap={args.overlap}"
    if args.drafter:
        label += f" drafter={args.drafter} acceptance={args.acceptance} k={args.k}"
    print(f"{label}: {wall * 1e3:.3f} ms per step")
    for key in ("tottime", "cumulative"):
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats(key).print_stats(args.top)
        print(text.getvalue())


if __name__ == "__main__":
    main()
