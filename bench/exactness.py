"""The exactness harness: lanes' three equalities, bitwise on token ids and their logprobs, on a
random-weight model of a real shape.

    python bench/exactness.py --shape llama-3.1-8b --device cuda [--requests 32] [--max-prompt 8192]

For each mode (exact, fast) and sampling (greedy, seeded): every request is first run alone
(the reference), then
- concurrent == solo: the same requests with at most 8, then 32, in flight;
- drafted == draft: false: every request with the replay drafter (acceptance 0.5, k <= 4; with
  --draft-branches W, trees of W branches, each right at a token with that chance);
- resumed == fresh: the longest requests cancelled twice mid-prefill, then retried;
- next turn == fresh: the 4 longest requests' answers extended into a follow-up prompt, run where
  the first turn's blocks (and a hybrid's output snapshot) are cached, and under another salt.
Each run uses its own cache salt, so a prompt-cache hit happens only where it is meant to.
Counts mismatching requests (token ids or logprobs differ; until the fifteenth session, token ids
only: random weights give wide margins, and fast mode's reruns of a MoE shape changed no token)
and writes bench/results/exactness-<shape>-<device>.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import random
import time
from pathlib import Path

import torch

from bench.shapes import SHAPES, random_checkpoint, random_packed_checkpoint
from lanes import Engine, EngineConfig, SamplingParams, build_engine
from lanes.drafter.replay import ReplayProposer

SAMPLINGS = {
    "greedy": SamplingParams(max_tokens=16, ignore_eos=True),
    "seeded": SamplingParams(max_tokens=16, ignore_eos=True, temperature=0.7, top_p=0.9, seed=1234),
}


Output = tuple[list[int], list[float]]  # a request's token ids and their logprobs


def output(c) -> Output:
    return c.token_ids, c.logprobs


def run_with_concurrency(engine: Engine, prompts, params, limit: int, salt: str) -> list[Output]:
    """All prompts, at most `limit` in flight; returns outputs in prompt order."""
    out: dict[int, Output] = {}
    ids: list[int] = []
    queue = list(enumerate(prompts))
    in_flight = 0
    index_of: dict[int, int] = {}
    while queue or in_flight:
        while queue and in_flight < limit:
            i, p = queue.pop(0)
            rid = engine.add_request(p, params, cache_salt=salt)
            index_of[rid] = i
            ids.append(rid)
            in_flight += 1
        for c in engine.step():
            failed(c)
            out[index_of[c.request_id]] = output(c)
            in_flight -= 1
    return [out[i] for i in range(len(prompts))]


def run_resumed(engine: Engine, prompt, params, salt: str) -> tuple[Output, int]:
    """Cancel at a third and at two thirds of the prompt, then run to the end; returns the
    output and the tokens the retry found in the prompt cache."""
    for fraction in (1 / 3, 2 / 3):
        rid = engine.add_request(prompt, params, cache_salt=salt)
        target = int(len(prompt) * fraction)

        def check(r, rid=rid, target=target):
            lane = next((x for x in engine.running if x.request_id == r), None)
            return r == rid and lane is not None and lane.num_computed >= target

        engine.cancel_check = check
        try:
            while not any(c.request_id == rid for c in engine.step()):
                pass
        finally:
            engine.cancel_check = None
    (out,) = engine.generate([prompt], params, cache_salt=salt)
    failed(out)
    return output(out), out.cached_tokens


def run_next_turn(engine: Engine, prompt, params, salt: str) -> tuple[Output, Output, int]:
    """A follow-up turn (the prompt, its answer, the prompt's first 8 tokens again) run where the
    first turn's blocks (and a hybrid's output snapshot) are cached, and fresh under another
    salt; returns (resumed, fresh, the tokens the resumed run found cached)."""
    (first,) = engine.generate([prompt], params, cache_salt=salt)
    failed(first)
    turn = list(prompt) + first.token_ids + list(prompt[:8])
    (resumed,) = engine.generate([turn], params, cache_salt=salt)
    (fresh,) = engine.generate([turn], params, cache_salt=salt + "-fresh")
    failed(resumed)
    failed(fresh)
    return output(resumed), output(fresh), resumed.cached_tokens


def failed(completion) -> None:
    """A request that failed has no tokens to compare: two empty outputs would count as equal,
    so the harness stops instead (a GPU run once reported 0 mismatches over failed requests)."""
    if completion.error:
        raise RuntimeError(f"request {completion.request_id} failed: {completion.error}")


def mismatches(got: list[Output], want: list[Output]) -> list[int]:
    return [i for i, (g, w) in enumerate(zip(got, want, strict=True)) if g != w]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="llama-3.1-8b", choices=sorted(SHAPES))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-prompt", type=int, default=8192)
    ap.add_argument("--modes", default="exact,fast")
    ap.add_argument("--kv-gib", type=float, default=40.0)
    ap.add_argument("--out", default=None)
    ap.add_argument("--bits", type=int, default=0, help="MLX affine codes of this width (0: float)")
    ap.add_argument(
        "--draft-branches", type=int, default=1, help="the drafted check verifies trees of W"
    )
    args = ap.parse_args()

    config = SHAPES[args.shape]
    ckpt = random_checkpoint(config, args.device)
    if args.bits:
        ckpt = random_packed_checkpoint(config, args.device, args.bits)
    rng = random.Random(0)
    lengths = sorted(
        {
            round(math.exp(x))
            for x in [
                math.log(16) + i * (math.log(args.max_prompt) - math.log(16)) / (args.requests - 1)
                for i in range(args.requests)
            ]
        }
    )
    while len(lengths) < args.requests:
        lengths.append(rng.randint(16, args.max_prompt))
    prompts = [
        [rng.randrange(config.vocab_size) for _ in range(n)] for n in lengths[: args.requests]
    ]
    report = {
        "shape": args.shape,
        "device": torch.cuda.get_device_name() if args.device == "cuda" else args.device,
        "requests": len(prompts),
        "prompt_lengths": [len(p) for p in prompts],
        "new_tokens": 16,
        "modes": {},
    }
    out = Path(
        args.out or Path(__file__).parent / "results" / f"exactness-{args.shape}-{args.device}.json"
    )
    for mode in args.modes.split(","):
        cfg = EngineConfig(
            device=args.device,
            exact=mode == "exact",
            kv_cache_bytes=int(args.kv_gib * 2**30),
            prompt_cache_bytes=int(args.kv_gib * 2**30 / 2),
            max_lanes=32,
            max_tokens_per_round=8192,
            prefill_chunk=512,
            num_draft_tokens=4,
            draft_branches=args.draft_branches,
        )
        engine = build_engine(checkpoint=ckpt, config=cfg)
        results = {}
        for name, params in SAMPLINGS.items():
            t0 = time.perf_counter()
            solo = run_with_concurrency(engine, prompts, params, 1, f"{mode}-{name}-solo")
            checks = {}
            for limit in (8, 32):
                got = run_with_concurrency(
                    engine, prompts, params, limit, f"{mode}-{name}-c{limit}"
                )
                checks[f"concurrent{limit}_vs_solo"] = mismatches(got, solo)
            records = {tuple(p): s[0] for p, s in zip(prompts, solo, strict=True)}
            engine.proposer = ReplayProposer(records, 0.5, config.vocab_size)
            followed = engine.metrics.num_branches_followed
            try:
                got = run_with_concurrency(engine, prompts, params, 8, f"{mode}-{name}-draft")
            finally:
                engine.proposer = None
            followed = engine.metrics.num_branches_followed - followed
            checks["drafted_vs_undrafted"] = mismatches(got, solo)
            longest = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))[:8]
            resumed = [
                run_resumed(engine, prompts[i], params, f"{mode}-{name}-resume") for i in longest
            ]
            bad = mismatches([r[0] for r in resumed], [solo[i] for i in longest])
            checks["resumed_vs_fresh"] = [longest[i] for i in bad]
            turns = [
                run_next_turn(engine, prompts[i], params, f"{mode}-{name}-turn")
                for i in longest[:4]
            ]
            checks["next_turn_vs_fresh"] = [
                longest[i] for i, (r, f, _) in enumerate(turns) if r != f
            ]
            engine.check_integrity()
            results[name] = {
                "mismatching_requests": {k: len(v) for k, v in checks.items()},
                "which": checks,
                "checked": {
                    k: {"resumed_vs_fresh": 8, "next_turn_vs_fresh": 4}.get(k, len(prompts))
                    for k in checks
                },
                "next_turn_cached_tokens": [t[2] for t in turns],
                "draft_branches": args.draft_branches,
                "verify_steps_that_followed_a_branch": followed,
                "resumed_cached_tokens": {
                    len(prompts[i]): r[1] for i, r in zip(longest, resumed, strict=True)
                },
                "seconds": round(time.perf_counter() - t0, 1),
            }
            print(
                mode,
                name,
                results[name]["mismatching_requests"],
                f"{results[name]['seconds']}s",
                flush=True,
            )
            report["modes"][mode] = results
            out.write_text(json.dumps(report, indent=2) + "\n")  # partial results survive a timeout
        del engine
        gc.collect()  # the engine's cycles too: the next mode builds its own (an 8B shape's
        if args.device == "cuda":  # second engine ran out of memory on an H100 without it)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
