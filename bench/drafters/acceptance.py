"""Acceptance at a fixed k on held-out chat prompts, greedy and at temperature 0.7 (coupled).

    python -m bench.drafters.acceptance [--set corpus|everyday] [--drafters ngram,DIR,DIR+ngram]
        [--prompts 6] [--new-tokens 128] [--k 4] [--branches 1,3] [--device cpu]
        [--device-rounds auto|off|both] [--batch N]

--set corpus: drafter/corpus.py chat prompts drawn with seed 12345 (training uses seed 0).
--set everyday: bench/data/everyday_prompts.json, what users send (coding, math, writing,
advice, science, trivia, multi-turn, system prompts, documents + a question; never read by
`lanes distill`), reported per category as well. All prompts in one batch, measured by
drafter.distill.held_out_acceptance (the check `lanes distill` ends with); generation stops at
end-of-sequence or after --new-tokens. Per drafter and temperature: drafts kept per verify step,
tokens per verify step (kept drafts + the target's own token), the share of output tokens that
came from kept drafts, and whether the drafted output equals the undrafted one.
--device-rounds both: every run twice, with drafted rounds on the device where they can run
(the default) and host-managed only; the head's drafts should be kept as often in both.
--batch N: the prompts in groups of N, one group after another (batch 1: as one user sends
them). Writes
bench/results/drafter-acceptance-[everyday-]<device>.json.
"""

from __future__ import annotations

import argparse
import json
import platform

import torch

from bench import DATA, RESULTS, ROOT
from lanes.drafter.corpus import chat_prompts, pydoc_texts, shakespeare_texts
from lanes.drafter.distill import SAMPLED_TEMPERATURE, held_out_acceptance
from lanes.models import open_checkpoint

SHIPPED = ROOT / "drafter" / "weights" / "smollm2-135m-instruct"
EVERYDAY = DATA / "everyday_prompts.json"


def everyday_prompts() -> list[tuple[str, list[dict]]]:
    """(category, messages) of the everyday held-out set."""
    return [(p["category"], p["messages"]) for p in json.loads(EVERYDAY.read_text())["prompts"]]


def summarise(by_prompt: list[tuple[int, int, int]]) -> dict:
    steps = sum(s for s, _, _ in by_prompt)
    kept = sum(k for _, k, _ in by_prompt)
    tokens = sum(t for _, _, t in by_prompt)
    return {
        "drafts_kept_per_verify": round(kept / max(1, steps), 3),
        "tokens_per_verify": round(tokens / max(1, steps), 3),
        "share_of_tokens_from_drafts": round(kept / max(1, tokens), 3),
        "tokens": tokens,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--drafters", default=f"ngram,{SHIPPED},{SHIPPED}+ngram")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--branches", default="1", help="draft branches per lane, comma-separated")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--set", default="corpus", choices=["corpus", "everyday"])
    ap.add_argument("--device-rounds", default="auto", choices=["auto", "off", "both"])
    ap.add_argument("--batch", type=int, default=None, help="prompts per group (all: one)")
    args = ap.parse_args()

    ckpt = open_checkpoint(args.model)
    if args.set == "everyday":
        categories, chats = zip(*everyday_prompts(), strict=True)
        chats = list(chats)
    else:
        sources = {"pydoc": pydoc_texts(), "shakespeare": shakespeare_texts()}
        chats = chat_prompts(args.prompts, seed=12345, sources=sources)
        categories = ["corpus"] * len(chats)
    rows = []
    rounds = {"auto": [None], "off": [False], "both": [None, False]}[args.device_rounds]
    runs = [
        (spec, int(w), dr)
        for spec in args.drafters.split(",")
        for w in args.branches.split(",")
        for dr in rounds
    ]
    for spec, width, dr in runs:
        measured = held_out_acceptance(
            ckpt, spec, chats, args.new_tokens, args.device, args.k, width, dr, args.batch
        )
        for temp, m in zip((0.0, SAMPLED_TEMPERATURE), measured.values(), strict=True):
            row = {
                "drafter": spec.replace(str(SHIPPED), "shipped"),
                "branches": width,
                "device_rounds": "auto" if dr is None else "off",
                "temperature": temp,
                **summarise(m["by_prompt"]),
                "drafted_equals_undrafted": m["drafted_equals_undrafted"],
                "device_rounds_run": m["device_rounds_run"],
            }
            if args.set == "everyday":
                row["by_category"] = {
                    c: summarise(
                        [b for b, cat in zip(m["by_prompt"], categories, strict=True) if cat == c]
                    )
                    for c in dict.fromkeys(categories)
                }
            rows.append(row)
            print(json.dumps(row), flush=True)
    meta = {
        "machine": f"{platform.machine()} {torch.get_num_threads()} threads, {args.device}",
        "model": ckpt.source,
        "prompts": f"{len(chats)} {args.set} chat prompts, one batch"
        + (", seed 12345" if args.set == "corpus" else ""),
        "new_tokens": args.new_tokens,
        "k": args.k,
        "branches": args.branches,
        "device_rounds": args.device_rounds,
        "batch": args.batch or len(chats),
    }
    name = "drafter-acceptance-" + ("everyday-" if args.set == "everyday" else "") + args.device
    name += "" if args.branches == "1" else "-branches"
    name += "" if args.device_rounds == "auto" else f"-rounds-{args.device_rounds}"
    name += "" if args.batch is None else f"-b{args.batch}"
    out = RESULTS / f"{name}.json"
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
