"""Where a speculative round's time goes at batch 1: the drafter's steps on the device, the
verify forward, and the GPU waiting for the host — against a plain (overlapped) decode step.

    python -m bench.profile.spec_round [--shape smollm2-135m] [--drafter DIR] [--acceptance 0.5]
        [--k 4] [--rounds 40] [--out FILE]

Random weights of the shape (exact mode, CUDA graphs); the drafter is an EAGLE-style head
directory (default: the shipped SmolLM2 head, which reads the random target's shared
embedding), run for its cost while replay drafts at a set acceptance are verified
(bench_engine.CostedReplay). Per round: host wall time; device time (union of kernel intervals,
torch.profiler); the drafter's span on the device (CUDA events around `propose`: from the
first drafter launch to its last kernel's end) and the host's time inside `propose`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from bench import ROOT
from bench.profile.busy import kernel_spans, settle
from bench.shapes import SHAPES, random_checkpoint, synthetic_prompt
from bench.speed.engine import CostedReplay
from lanes import EngineConfig, SamplingParams, build_engine
from lanes.drafter import make_proposer
from lanes.drafter.replay import ReplayProposer

SHIPPED = ROOT / "drafter" / "weights" / "smollm2-135m-instruct"


def profiled(engine, steps: int) -> tuple[float, float]:
    """`steps` engine steps: (host wall seconds, ms of kernels: the union of their intervals)."""
    wall, spans = kernel_spans(engine, steps)
    covered, end = 0.0, float("-inf")
    for a, b in spans:
        if b > end:
            covered += b - max(a, end)
            end = b
    return wall, covered / 1e3


class TimedPropose:
    """Wraps a proposer's propose with CUDA events and host timers."""

    def __init__(self, proposer) -> None:
        self.inner, self.spans = proposer.propose, []
        proposer.propose = self

    def __call__(self, lanes, num_drafts):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        start.record()
        drafts = self.inner(lanes, num_drafts)
        end.record()
        self.spans.append((start, end, time.perf_counter() - t0))
        return drafts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="smollm2-135m", choices=sorted(SHAPES))
    ap.add_argument("--drafter", default=str(SHIPPED))
    ap.add_argument("--acceptance", type=float, default=0.5)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--out", default="bench/results/trace-spec-round-h200.json")
    ap.add_argument("--cprofile", type=int, default=0, help="then N rounds under cProfile")
    ap.add_argument(
        "--no-chain", action="store_true", help="the head's steps as separate graph replays"
    )
    args = ap.parse_args()
    shape = SHAPES[args.shape]
    ckpt = random_checkpoint(shape, "cuda")
    config = EngineConfig(
        device="cuda",
        prompt_cache_bytes=0,
        num_draft_tokens=args.k,
        adaptive_drafts=False,
        cost_aware_drafts=False,
    )
    engine = build_engine(checkpoint=ckpt, config=config)
    prompt = synthetic_prompt(shape.vocab_size, 128, 3)
    new = args.rounds * (args.k + 1) + 200
    params = SamplingParams(max_tokens=new, ignore_eos=True)
    (ref,) = engine.generate([prompt], params)
    report = {"shape": args.shape, "acceptance_set": args.acceptance, "k": args.k}

    # plain decode steps (overlapped), the drafted request's baseline
    settle(engine, shape.vocab_size, 1, 128, args.rounds + 40)
    wall, kernels = profiled(engine, args.rounds)
    while engine.has_work():
        engine.step()
    report["plain"] = {
        "wall_ms_per_step": wall / args.rounds * 1e3,
        "device_ms_per_step": kernels / args.rounds,
    }

    # speculative rounds: the head's forwards for their cost, replay drafts verified (an engine
    # built with the proposer: its target keeps the features the head reads)
    del engine
    head = make_proposer(args.drafter, config, ckpt)
    if args.no_chain:  # the head's drafts 2..k as separate replays (the path before chaining)
        head.chain = None
    report["chained"] = head.chain is not None
    replay = ReplayProposer({tuple(prompt): ref.token_ids}, args.acceptance, shape.vocab_size)
    engine = build_engine(checkpoint=ckpt, config=config, proposer=CostedReplay(replay, head))
    timed = TimedPropose(engine.proposer)
    lane = engine.submit(prompt, params)
    while lane.num_verify_steps < 10:  # past prefill and the first rounds' graph captures
        engine.step()
    timed.spans.clear()
    before_tokens, before_steps = len(lane.output_ids), lane.num_verify_steps
    wall, kernels = profiled(engine, args.rounds)
    rounds = lane.num_verify_steps - before_steps
    tokens = len(lane.output_ids) - before_tokens
    drafter_device = [s.elapsed_time(e) for s, e, _ in timed.spans]
    drafter_host = [h * 1e3 for _, _, h in timed.spans]
    report["drafted"] = {
        "rounds": rounds,
        "tokens_per_round": tokens / rounds,
        "wall_ms_per_round": wall / rounds * 1e3,
        "device_ms_per_round": kernels / rounds,
        "drafter_device_span_ms_median": statistics.median(drafter_device),
        "drafter_host_ms_median": statistics.median(drafter_host),
    }
    d, p = report["drafted"], report["plain"]
    d["gpu_idle_ms_per_round"] = d["wall_ms_per_round"] - d["device_ms_per_round"]
    d["tok_s"] = 1e3 * d["tokens_per_round"] / d["wall_ms_per_round"]
    p["tok_s"] = 1e3 / p["wall_ms_per_step"]
    report["speedup"] = d["tok_s"] / p["tok_s"]
    print(json.dumps(report, indent=2))
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    if args.cprofile:  # where the host's time per round goes
        print_host_profile(engine, args.cprofile)


def print_host_profile(engine, steps: int) -> None:
    """`steps` engine steps under cProfile: the top functions by own and by cumulative time."""
    import cProfile
    import pstats

    with cProfile.Profile() as host:
        for _ in range(steps):
            engine.step()
    stats = pstats.Stats(host)
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats(45)


if __name__ == "__main__":
    main()
