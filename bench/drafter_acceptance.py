"""Acceptance at a fixed k on held-out chat prompts, greedy and at temperature 0.7 (coupled).

    python -m bench.drafter_acceptance [--drafters ngram,DIR,DIR+ngram] [--prompts 6]
        [--new-tokens 128] [--k 4] [--device cpu]

The prompts are drafter/corpus.py chat prompts drawn with seed 12345 (training uses seed 0), all
in one batch; generation stops at end-of-sequence or after --new-tokens. Per drafter and
temperature: drafts kept per verify step, tokens per verify step (kept drafts + the target's own
token), and whether the drafted output equals the undrafted one. Writes
bench/results/drafter-acceptance-<device>.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
from pathlib import Path

import torch

from drafter import make_proposer
from drafter.corpus import chat_prompts, pydoc_texts, shakespeare_texts
from lanes import Engine, EngineConfig, SamplingParams
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
    cfg = EngineConfig(device=args.device, num_draft_tokens=args.k, adaptive_drafts=False)
    sources = {"pydoc": pydoc_texts(), "shakespeare": shakespeare_texts()}
    chats = chat_prompts(args.prompts, seed=12345, sources=sources)
    plain = Engine(checkpoint=ckpt, config=cfg)
    rows = []
    for temp in (0.0, 0.7):
        params = [
            SamplingParams(max_tokens=args.new_tokens, temperature=temp, seed=1000 + i)
            for i in range(len(chats))
        ]
        want = plain.generate(chats, [dataclasses.replace(p, draft=False) for p in params])
        for spec in args.drafters.split(","):
            engine = Engine(checkpoint=ckpt, config=cfg, proposer=make_proposer(spec, cfg, ckpt))
            got = engine.generate(chats, params)
            steps = sum(c.num_target_steps - 1 for c in got)  # the first token has no drafts
            row = {
                "drafter": spec.replace(str(SHIPPED), "shipped"),
                "temperature": temp,
                "drafts_kept_per_verify": round(sum(c.num_accepted for c in got) / steps, 3),
                "tokens_per_verify": round(sum(len(c.token_ids) for c in got) / steps, 3),
                "tokens": sum(len(c.token_ids) for c in got),
                "drafted_equals_undrafted": all(
                    a.token_ids == b.token_ids for a, b in zip(got, want, strict=True)
                ),
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
