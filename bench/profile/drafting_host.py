"""What a drafting lane that drafts nothing costs the host: decode rounds of a tiny random model
(the forward is cheap, so the engine's own Python shows) with an untrained EAGLE-style head whose
measured costs say drafting never pays, as at load on the GPU, against the same requests sent
with `draft: false`, alternating, on one engine.

    python -m bench.profile.drafting_host [--lanes 16] [--passes 5] [--new-tokens 96]

Prints and writes (bench/results/drafting-host-<lanes>.json) the median ms per decode round of
both kinds and the drafted one's extra ms per lane. The head's probes (one draft every 64th
round) run as they do at load and are counted.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from bench import RESULTS
from bench.shapes import TINY, id_tokenizer, random_checkpoint, synthetic_prompt
from lanes import EngineConfig, SamplingParams, build_engine
from lanes.config import ModelConfig
from lanes.draft_costs import DraftCosts
from lanes.drafter.distill import EagleHead, hf_config, save


def untrained_head(target, out: Path) -> None:
    """A random one-layer head of the target's width, saved as `lanes distill` saves one."""
    cfg = ModelConfig.from_hf(hf_config(target.config, num_layers=1))
    torch.manual_seed(0)
    head = EagleHead(cfg, target, torch.arange(target.config.vocab_size), "cpu", None)
    save(head, cfg, out)
    (out / "drafter.json").write_text(json.dumps({"kind": "eagle", "target_feature_layers": None}))


def decode_rounds(engine, prompts, params) -> tuple[list[float], int]:
    """Submit the prompts together, step through their prefill, then time each decode round
    to the end: (seconds of each decode round, drafts verified)."""
    drafted = engine.metrics.num_drafted
    for p in prompts:
        engine.submit(p, params)
    while engine.waiting or any(x.num_computed < len(x.prompt_ids) for x in engine.running):
        engine.step()
    times = []
    while engine.has_work():
        t = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t)
    return times, engine.metrics.num_drafted - drafted


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lanes", type=int, default=16)
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--new-tokens", type=int, default=96)
    args = ap.parse_args()
    shape = dataclasses.replace(TINY, tie_word_embeddings=True)  # a head shares a tied LM head
    target = random_checkpoint(shape, "cpu", tokenizer=id_tokenizer(shape.vocab_size))
    with tempfile.TemporaryDirectory() as tmp:
        untrained_head(target, Path(tmp))
        config = EngineConfig(
            max_lanes=args.lanes, prompt_cache_bytes=0, drafter=tmp, cost_aware_drafts=True
        )
        engine = build_engine(checkpoint=target, config=config)
    # costs that no acceptance can beat (a head step dearer than ten target rounds), as the
    # engine measures them at load on the GPU; plain rounds keep `forward` measured
    engine.drafting.costs = DraftCosts(forward=1e-3, per_draft=0.0, per_draft_step=1.0)
    prompts = [synthetic_prompt(shape.vocab_size, 64, 100 + i) for i in range(args.lanes)]
    drafted = SamplingParams(max_tokens=args.new_tokens, ignore_eos=True)
    plain = dataclasses.replace(drafted, draft=False)
    decode_rounds(engine, prompts, drafted)  # warm-up
    decode_rounds(engine, prompts, plain)
    runs = {"drafted": [], "plain": []}
    drafts = 0
    for p in range(args.passes):
        order = [("drafted", drafted), ("plain", plain)]
        for name, params in order if p % 2 == 0 else order[::-1]:
            times, n = decode_rounds(engine, prompts, params)
            runs[name].append(statistics.median(times) * 1e3)
            drafts += n if name == "drafted" else 0
    d, u = statistics.median(runs["drafted"]), statistics.median(runs["plain"])
    out = {
        "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads",
        "model": "tiny random (bench.shapes.TINY, tied), exact mode, no prompt cache",
        "lanes": args.lanes,
        "new_tokens": args.new_tokens,
        "passes": args.passes,
        "drafted_round_ms": [round(x, 4) for x in runs["drafted"]],
        "plain_round_ms": [round(x, 4) for x in runs["plain"]],
        "median_drafted_ms": round(d, 4),
        "median_plain_ms": round(u, 4),
        "extra_us_per_lane": round((d - u) * 1e3 / args.lanes, 2),
        "drafts_verified": drafts,
    }
    print(json.dumps({k: v for k, v in out.items() if not k.endswith("round_ms")}))
    path = RESULTS / f"drafting-host-{args.lanes}.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
