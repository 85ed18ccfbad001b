"""Speculative decoding on one machine: every drafter against no drafter, batch 1.

    python -m bench.drafters.compare [--model M] [--device cpu] [--new-tokens 64] [--repeats 3]
        [--everyday N] [--cost-aware on|off|both]

For each drafter: acceptance, tokens per target forward, and the speedup over no drafter from
medians of alternating runs (none, drafter, none, drafter, ...). Drafters: n-gram; a model
drafter made of the target's first layers (the default model has no public drafter we can
fetch); replay at acceptance 0.5 and 0.8 (proposes the recorded undrafted output). Every drafted
output is checked against the undrafted one. Writes bench/results/drafters-<device>.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import time

import torch

from bench import RESULTS
from lanes import EngineConfig, SamplingParams, build_engine
from lanes.drafter.model import ModelDrafter
from lanes.drafter.ngram import NgramProposer
from lanes.drafter.replay import ReplayProposer
from lanes.models import open_checkpoint

PROMPTS = [
    "Here is some Python code:\n\ndef add(a, b):\n    return a + b\n\n"
    "Rewrite the function add with type hints, keeping the body the same.",
    "Write a short story about a lighthouse keeper.",
]


def timed(engine, chats, params):
    """Each prompt alone (batch 1), one after another; total seconds and the completions."""
    start = time.perf_counter()
    outs = [engine.generate([chat], params)[0] for chat in chats]
    return time.perf_counter() - start, outs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--k", default="4", help="draft lengths (--num-draft-tokens), comma-separated")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--draft-layers", type=int, default=8)
    ap.add_argument("--distilled", default=None, help="a `lanes distill` drafter directory to add")
    ap.add_argument("--only", default=None, help="comma-separated drafter names to run")
    ap.add_argument(
        "--chat-prompts",
        type=int,
        default=0,
        help="use N held-out corpus chat prompts (drafter/corpus.py, seed 12345) instead",
    )
    ap.add_argument(
        "--everyday",
        type=int,
        default=0,
        help="use N prompts of the everyday held-out set (bench/data), one per category in turn",
    )
    ap.add_argument(
        "--cost-aware",
        choices=["on", "off", "both"],
        default="off",
        help="drafts chosen from measured costs (EngineConfig.cost_aware_drafts); both: each "
        "drafter twice",
    )
    ap.add_argument(
        "--device-rounds",
        choices=["auto", "off", "both"],
        default="auto",
        help="drafted rounds kept on the device where the drafter can (EngineConfig."
        "device_rounds, lanes/device_rounds.py); both: each drafter with and without",
    )
    args = ap.parse_args()

    ckpt = open_checkpoint(args.model)
    cfg = EngineConfig(device=args.device, num_draft_tokens=4)
    params = SamplingParams(max_tokens=args.new_tokens, ignore_eos=True)
    base = build_engine(checkpoint=ckpt, config=cfg)
    chats = [[{"role": "user", "content": p}] for p in PROMPTS]
    if args.chat_prompts:
        from lanes.drafter.corpus import chat_prompts, pydoc_texts, shakespeare_texts

        sources = {"pydoc": pydoc_texts(), "shakespeare": shakespeare_texts()}
        chats = chat_prompts(args.chat_prompts, seed=12345, sources=sources)
    if args.everyday:
        from bench.drafters.acceptance import everyday_prompts

        by_category: dict[str, list] = {}
        for category, messages in everyday_prompts():
            by_category.setdefault(category, []).append(messages)
        rounds = zip(*by_category.values(), strict=False)  # one of each category, then again
        chats = [m for r in rounds for m in r][: args.everyday]
    ref = [base.generate([chat], params)[0] for chat in chats]
    records = {tuple(o.prompt_ids): o.token_ids for o in ref}
    vocab = ckpt.config.vocab_size
    drafters = {
        "ngram": NgramProposer(),
        f"model-{args.draft_layers}-layers": ModelDrafter(
            ckpt.first_layers(args.draft_layers), ckpt.tokenizer, cfg
        ),
        "replay-0.5": ReplayProposer(records, 0.5, vocab),
        "replay-0.8": ReplayProposer(records, 0.8, vocab),
    }
    if args.distilled:
        from lanes.drafter import make_proposer

        drafters["distilled"] = make_proposer(args.distilled, cfg, ckpt)
        drafters["distilled+ngram"] = make_proposer(args.distilled + "+ngram", cfg, ckpt)
    if args.only:
        drafters = {k: v for k, v in drafters.items() if k in args.only.split(",")}
    policies = {"on": [True], "off": [False], "both": [False, True]}[args.cost_aware]
    ks = [int(k) for k in args.k.split(",")]
    on_device = {"auto": [None], "off": [False], "both": [False, None]}[args.device_rounds]
    runs = [
        (
            name
            + ("" if len(policies) == 1 else f" cost-aware={'on' if aware else 'off'}")
            + ("" if len(on_device) == 1 else f" device-rounds={'off' if dr is False else 'on'}")
            + ("" if len(ks) == 1 else f" k={k}"),
            p,
            aware,
            dr,
            k,
        )
        for name, p in drafters.items()
        for aware in policies
        for dr in on_device
        for k in ks
    ]
    results = {}
    for name, proposer, aware, dr, k in runs:
        config = cfg.replace(cost_aware_drafts=aware, device_rounds=dr, num_draft_tokens=k)
        engine = build_engine(checkpoint=ckpt, config=config, proposer=proposer)
        plain_s, drafted_s = [], []
        for i in range(args.repeats + 1):  # the first pair is a warm-up
            t_plain, _ = timed(base, chats, dataclasses.replace(params, draft=False))
            t_draft, outs = timed(engine, chats, params)
            if i:
                plain_s.append(t_plain)
                drafted_s.append(t_draft)
        equal = [o.token_ids == r.token_ids for o, r in zip(outs, ref, strict=True)]
        drafted = sum(o.num_drafted for o in outs)
        accepted = sum(o.num_accepted for o in outs)
        tokens = sum(len(o.token_ids) for o in outs)
        steps = sum(o.num_target_steps for o in outs)
        results[name] = {
            "device_rounds": engine.device_rounds is not None,
            "acceptance": accepted / drafted if drafted else None,
            "tokens_per_target_forward": tokens / steps,
            "median_s_undrafted": statistics.median(plain_s),
            "median_s_drafted": statistics.median(drafted_s),
            "speedup": statistics.median(plain_s) / statistics.median(drafted_s),
            "outputs_equal_undrafted": all(equal),
            "runs_undrafted_s": plain_s,
            "runs_drafted_s": drafted_s,
        }
    print(
        f"{'drafter':34} {'accept':>7} {'tok/fwd':>8} {'undrafted s':>12} {'drafted s':>10} {'speedup':>8} equal"
    )
    for name, r in results.items():
        acc = f"{r['acceptance']:.2f}" if r["acceptance"] is not None else "-"
        print(
            f"{name:34} {acc:>7} {r['tokens_per_target_forward']:8.2f} {r['median_s_undrafted']:12.2f}"
            f" {r['median_s_drafted']:10.2f} {r['speedup']:7.2f}x {r['outputs_equal_undrafted']}"
        )
    meta = {
        "machine": f"{platform.machine()} {torch.get_num_threads()} threads, {args.device}",
        "model": ckpt.source,
        "dtype": cfg.torch_dtype_name,
        "batch": 1,
        "prompts": len(chats),
        "prompt_set": f"{args.chat_prompts} corpus chat prompts"
        if args.chat_prompts
        else f"{args.everyday} everyday prompts"
        if args.everyday
        else "built-in",
        "new_tokens": args.new_tokens,
        "num_draft_tokens": ks,
        "repeats": args.repeats,
    }
    tag = "" if not args.only else "-" + args.only.replace(",", "-")
    tag += "-everyday" if args.everyday else ""
    tag += "-cost-aware-both" if args.cost_aware == "both" else ""
    tag += "-device-rounds-both" if args.device_rounds == "both" else ""
    tag += f"-k{args.k.replace(',', '-')}" if len(ks) > 1 else ""
    out = RESULTS / f"drafters{tag}-{args.device}.json"
    out.write_text(json.dumps({"meta": meta, "drafters": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
