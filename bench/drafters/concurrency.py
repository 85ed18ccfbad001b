"""Does drafting pay at every concurrency? `make serve`'s configuration, everyday questions.

    python -m bench.drafters.concurrency [--model M] [--drafter D] [--device cpu]
        [--concurrency 1,4] [--prompts 8] [--new-tokens 64] [--passes 2]
        [--draft-branches 1] [--num-draft-tokens 4] [--device-rounds auto|off]

One engine (the default model and `make serve`'s drafter unless told otherwise); the held-out
everyday questions (bench/data/everyday_prompts.json, never read by `lanes distill`) in groups
of `concurrency` sent together, greedy. Each pass runs every group drafted and with
`draft: false` on the same engine, the order alternating from pass to pass. Reports per
concurrency: output tok/s of both (each pass), the median speedup, the share of output tokens
that came from accepted drafts, tokens per verify, and at concurrency 1 the worst single
prompt's speedup (median over passes). Every drafted output is checked against its undrafted
one. Writes bench/results/drafters-concurrency-<device>.json.

`--profile C`: then one more run of every group at concurrency C, drafted and undrafted, each
under cProfile, with the engine's round counts and measured seconds around it (where a drafted
round's time goes when drafting loses); writes drafters-concurrency-profile-<device>-c<C>.txt.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import io
import json
import logging
import platform
import pstats
import statistics
import time
from pathlib import Path

import torch

from bench import RESULTS
from lanes import EngineConfig, SamplingParams, build_engine

SHIPPED = "drafter/weights/smollm2-135m-instruct+ngram"  # what `make serve` passes
EVERYDAY = Path(__file__).resolve().parents[1] / "data" / "everyday_prompts.json"


def everyday(count: int) -> list[list[dict]]:
    """`count` held-out questions, spread over the categories."""
    prompts = json.loads(EVERYDAY.read_text())["prompts"]
    step = max(1, len(prompts) // count)
    return [p["messages"] for p in prompts[::step][:count]]


def run_groups(engine, chats, concurrency, params):
    """Groups of `concurrency` chats sent together, one group after another: (seconds, the
    completions, each group's seconds)."""
    outs, times = [], []
    start = time.perf_counter()
    for i in range(0, len(chats), concurrency):
        t0 = time.perf_counter()
        outs += engine.generate(chats[i : i + concurrency], params)
        times.append(time.perf_counter() - t0)
    return time.perf_counter() - start, outs, times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--drafter", default=SHIPPED)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--cost-aware", choices=["on", "off"], default="on")
    ap.add_argument("--draft-branches", type=int, default=1, help="draft trees of W branches")
    ap.add_argument("--num-draft-tokens", type=int, default=EngineConfig.num_draft_tokens)
    ap.add_argument("--device-rounds", choices=["auto", "off"], default="auto")
    ap.add_argument("--profile", type=int, default=0, help="profile one run at this concurrency")
    ap.add_argument("--verbose", action="store_true", help="the engine's INFO log (device rounds)")
    ap.add_argument(
        "--warm",
        action="store_true",
        help="one untimed drafted and plain run per concurrency first",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=0,
        help="then one drafted run at this concurrency, round by round",
    )
    args = ap.parse_args()
    if args.verbose:
        logging.basicConfig(level=logging.WARNING)
        logging.getLogger("lanes").setLevel(logging.INFO)
    cfg = EngineConfig(
        device=args.device,
        drafter=args.drafter,
        cost_aware_drafts=args.cost_aware == "on",
        draft_branches=args.draft_branches,
        num_draft_tokens=args.num_draft_tokens,
        device_rounds=False if args.device_rounds == "off" else None,
    )
    engine = build_engine(args.model, cfg)
    chats = everyday(args.prompts)
    drafted = SamplingParams(max_tokens=args.new_tokens, ignore_eos=True)
    plain = dataclasses.replace(drafted, draft=False)
    # warm-up: kernels built, and every prompt in the prompt cache and the head's own, so that
    # both modes find the same cached prefixes (the comparison is of the decode rounds; a
    # prompt the head's cache lacks is recomputed for it, lanes/scheduler.py _drafter_reach)
    run_groups(engine, chats, 1, drafted)
    run_groups(engine, chats, 1, plain)
    rows = []
    for c in [int(x) for x in args.concurrency.split(",")]:
        if args.warm:  # what a first run at this concurrency captures or compiles, done now
            run_groups(engine, chats, c, drafted)
            run_groups(engine, chats, c, plain)
        passes, mismatches = [], 0
        for p in range(args.passes):
            order = [("drafted", drafted), ("plain", plain)]
            result = {}
            for name, params in order if p % 2 == 0 else order[::-1]:
                before = round_counts(engine)
                seconds, outs, times = run_groups(engine, chats, c, params)
                counts = {k: round(v - before[k], 4) for k, v in round_counts(engine).items()}
                tokens = sum(len(o.token_ids) for o in outs)
                result[name] = {
                    "tok_s": tokens / seconds,
                    "outs": outs,
                    "group_seconds": times,
                    "counts": counts,
                    "costs_after": costs_now(engine),
                }
            d, u = result["drafted"], result["plain"]
            mismatches += sum(
                a.token_ids != b.token_ids for a, b in zip(d["outs"], u["outs"], strict=True)
            )
            tokens = sum(len(o.token_ids) for o in d["outs"])
            verifies = sum(o.num_target_steps for o in d["outs"])
            passes.append(
                {
                    "drafted_tok_s": round(d["tok_s"], 1),
                    "plain_tok_s": round(u["tok_s"], 1),
                    "speedup": round(d["tok_s"] / u["tok_s"], 3),
                    "share_from_drafts": round(sum(o.num_accepted for o in d["outs"]) / tokens, 3),
                    "tokens_per_verify": round(tokens / max(1, verifies), 3),
                    "drafted_counts": d["counts"],
                    "plain_counts": u["counts"],
                    "costs_after_drafted": d["costs_after"],
                    "per_group_speedup": [
                        round(b / a, 3)
                        for a, b in zip(d["group_seconds"], u["group_seconds"], strict=True)
                    ],
                }
            )
        row = {
            "concurrency": c,
            "passes": passes,
            "median_speedup": round(statistics.median(p["speedup"] for p in passes), 3),
            "drafted_equals_undrafted": f"{len(chats) * args.passes - mismatches}"
            f"/{len(chats) * args.passes}",
        }
        if c == 1:
            per_prompt = [
                statistics.median(p["per_group_speedup"][i] for p in passes)
                for i in range(len(chats))
            ]
            worst = min(range(len(chats)), key=per_prompt.__getitem__)
            row["worst_prompt"] = {
                "speedup": round(per_prompt[worst], 3),
                "question": chats[worst][-1]["content"][:80],
            }
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "passes"}), flush=True)
    out = {
        "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads",
        "device": args.device,
        "model": args.model or "default (SmolLM2-135M-Instruct Q4_1 GGUF)",
        "drafter": args.drafter,
        "cost_aware_drafts": args.cost_aware == "on",
        "draft_branches": args.draft_branches,
        "num_draft_tokens": args.num_draft_tokens,
        "device_rounds": args.device_rounds,
        "prompts": len(chats),
        "new_tokens": args.new_tokens,
        "greedy": True,
        "warmed_per_concurrency": args.warm,
        "rows": rows,
    }
    tag = "" if args.draft_branches == 1 else f"-b{args.draft_branches}"
    tag += (
        ""
        if args.num_draft_tokens == EngineConfig.num_draft_tokens
        else f"-k{args.num_draft_tokens}"
    )
    tag += "" if args.device_rounds == "auto" else "-no-device-rounds"
    path = RESULTS / f"drafters-concurrency-{args.device}{tag}.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")
    if args.rounds:
        path = RESULTS / f"drafters-concurrency-rounds-{args.device}-c{args.rounds}{tag}.json"
        path.write_text(json.dumps(round_by_round(engine, chats, args.rounds, drafted)) + "\n")
        print(f"wrote {path}")
    if args.profile:
        text = [profiled(engine, chats, args.profile, p) for p in (drafted, plain)]
        path = RESULTS / f"drafters-concurrency-profile-{args.device}-c{args.profile}.txt"
        path.write_text("\n\n".join(text))
        print(f"wrote {path}")


def round_counts(engine) -> dict:
    m, rounds = engine.metrics, engine.device_driver.device_rounds
    return {
        "rounds": m.num_rounds,
        "overlapped_rounds": m.num_overlapped_rounds,
        "device_rounds": rounds.num_rounds if rounds is not None else 0,
        "busy_seconds": m.busy_seconds,
        "drafter_seconds": m.drafter_seconds,
        "verify_steps": m.num_verify_steps,
        "drafted": m.num_drafted,
        "accepted": m.num_accepted,
    }


def costs_now(engine) -> dict:
    """What the per-round decisions read now: a plain round's measured seconds, the device
    rounds' mean tokens per lane and seconds since they last started, the host-managed costs."""
    driver, costs = engine.device_driver, engine.drafting.costs

    def ms(x):
        return None if x is None else round(x * 1e3, 3)

    return {
        "plain_round_ms": ms(costs.forward),
        "plain_rounds_ms": [ms(x) for x in costs.plain_seconds],  # the median's window
        "per_draft_ms": ms(costs.per_draft),
        "per_draft_step_ms": ms(costs.per_draft_step),
        "device_samples": driver.costs.samples,
        "device_tokens_per_lane": round(driver.costs.tokens, 3),
        "device_round_ms": ms(driver.costs.seconds),
        "paused_until": driver.paused_until,
        "rounds": engine.metrics.num_rounds,
    }


def round_by_round(engine, chats, concurrency, params) -> dict:
    """One drafted and one plain run's rounds as the engine recorded them (the last 1,024 of
    each): decode and prefill tokens, drafts verified, wall, host and drafter milliseconds,
    overlapped, a device round; and per kind of round (prefill, plain, drafted, device) their
    count and milliseconds, so that where a drafted run's extra time goes is plain."""
    fields = [
        "decode_tokens", "prefill_tokens", "drafts", "ms", "host_ms", "drafter_ms", "overlapped",
        "device_round",
    ]  # fmt: skip
    runs = {}
    for name, p in (("drafted", params), ("plain", dataclasses.replace(params, draft=False))):
        before = engine.metrics.num_rounds
        seconds, _, _ = run_groups(engine, chats, concurrency, p)
        n = min(engine.metrics.num_rounds - before, len(engine.metrics.recent))
        recent = list(engine.metrics.recent)[-n:]
        kinds: dict[str, list[float]] = {}
        for r in recent:
            kind = (
                "prefill" if r.prefill_tokens
                else "device" if r.device_round
                else "drafted" if r.drafts
                else "plain"
            )  # fmt: skip
            kinds.setdefault(kind, []).append(r.seconds * 1e3)
        runs[name] = {
            "seconds": round(seconds, 4),
            "by_kind": {
                k: {
                    "rounds": len(v),
                    "ms": round(sum(v), 2),
                    "median_ms": round(statistics.median(v), 3),
                }
                for k, v in kinds.items()
            },
            "rounds": [
                [
                    r.decode_tokens,
                    r.prefill_tokens,
                    r.drafts,
                    round(r.seconds * 1e3, 3),
                    round(r.host_seconds * 1e3, 3),
                    round(r.drafter_seconds * 1e3, 3),
                    int(r.overlapped),
                    int(r.device_round),
                ]
                for r in recent
            ],  # fmt: skip
        }
    return {"concurrency": concurrency, "fields": fields, **runs}


def profiled(engine, chats, concurrency, params) -> str:
    """One run of every group under cProfile: the counts it added and the top functions."""
    before = round_counts(engine)
    profile = cProfile.Profile()
    profile.enable()
    seconds, outs, _ = run_groups(engine, chats, concurrency, params)
    profile.disable()
    after = round_counts(engine)
    delta = {k: round(after[k] - before[k], 4) for k in before}
    tokens = sum(len(o.token_ids) for o in outs)
    head = f"draft={params.draft} concurrency={concurrency}: {tokens} tokens in {seconds:.2f} s"
    stream = io.StringIO()
    stats = pstats.Stats(profile, stream=stream)
    stats.sort_stats("tottime").print_stats(30)
    stats.sort_stats("cumulative").print_stats(40)
    return f"{head}\n{json.dumps(delta)}\n{stream.getvalue()}"


if __name__ == "__main__":
    main()
