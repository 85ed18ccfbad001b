"""In-process engine benchmarks on random-weight models of real shapes (GPU, or CPU at tiny
settings):

    python -m bench.speed.engine --sections spec,share,c64,hf [--target llama-3.1-8b]
        [--drafter llama-3.2-1b] [--device cuda] [--out bench/results/engine-h200.json]

- spec:  speculative speedup surface: replay acceptance 0.5..0.9 x draft length 1..8 at batch 1,
         drafts costed by running the 1B-shaped drafter's forwards (its tokens are replaced by
         the replay's), against no drafter; medians of alternating runs;
- share: --prefill-share 0.1..0.9 under a mixed workload (long prompts arriving while lanes
         decode): output tok/s, TTFT of the long prompts, inter-token latency of the decoders;
- c64:   64 concurrent requests, 512-token prompts, 256 new tokens: output tok/s;
- hf:    transformers' generate (static cache, eager) on the same shape, batch 1.
Every section records peak GPU memory. Plots: `python -m bench.plots <json>`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from bench import RESULTS
from bench.shapes import SHAPES, id_tokenizer, random_checkpoint, synthetic_prompt
from lanes import Engine, EngineConfig, SamplingParams, build_engine
from lanes.drafter.base import Draft, Proposer
from lanes.drafter.model import ModelDrafter
from lanes.drafter.replay import ReplayProposer


class CostedReplay(Proposer):
    """Replay drafts (controlled acceptance) that cost what a real drafter's forwards cost (a
    model drafter, or an EAGLE-style head, which observes the target's features as usual)."""

    name = "costed-replay"

    def __init__(self, replay: ReplayProposer, drafter: Proposer) -> None:
        self.replay, self.drafter = replay, drafter
        self.uses_target_hidden = drafter.uses_target_hidden
        self.target_feature_layers = drafter.target_feature_layers

    def observe(self, lane, start, hidden):
        self.drafter.observe(lane, start, hidden)

    def prefill(self, steps):
        self.drafter.prefill(steps)

    def propose(self, lanes, num_drafts, num_branches=None) -> list[Draft]:
        made = self.drafter.propose(lanes, num_drafts)  # spent for its time; tokens dropped
        replayed = self.replay.propose(lanes, num_drafts)
        on_device = next((d.source for d in made if d.source is not None), None)
        if on_device is None:
            return replayed
        # The drafter left its drafts on the device: so do these, so that the round waits for
        # the device as it does with the drafter's own drafts (the verify reads them there).
        flat = [t for d in replayed for t in d.token_ids]
        source = torch.tensor(flat, dtype=torch.int64).to(on_device.device, non_blocking=True)
        drafts, at = [], 0
        for d in replayed:
            drafts.append(Draft(rows=tuple(range(at, at + len(d.token_ids))), source=source))
            at += len(d.token_ids)
        return drafts

    def accepted(self, lane):
        self.drafter.accepted(lane)

    def release(self, lane):
        self.drafter.release(lane)


def peak_gib(device: str) -> float | None:
    return torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None


def prompt(vocab: int, n: int, seed: int) -> list[int]:
    return synthetic_prompt(vocab, n, seed, offset=17)


def decode_seconds(
    engine: Engine, p: list[int], new: int, salt: str
) -> tuple[float, list[int], float]:
    (out,) = engine.generate([p], SamplingParams(max_tokens=new, ignore_eos=True), cache_salt=salt)
    t = out.token_times
    acc = out.num_accepted / out.num_drafted if out.num_drafted else 0.0
    return t[-1] - t[0], out.token_ids, acc


def section_spec(
    engine: Engine, drafter: ModelDrafter, vocab: int, new: int, repeats: int, accs, ks
) -> dict:
    p = prompt(vocab, 128, 1)
    engine.proposer = None
    _, record, _ = decode_seconds(engine, p, new, "rec")
    records = {tuple(p): record}
    surface = []
    for a in accs:
        for k in ks:
            base, spec, rates = [], [], []
            costed = CostedReplay(ReplayProposer(records, a, vocab), drafter)
            for i in range(repeats + 1):
                engine.proposer = None
                t0, ids0, _ = decode_seconds(engine, p, new, f"b{a}{k}{i}")
                engine.proposer = costed
                # k fixed: the surface is acceptance x draft length, not what k a policy picks
                engine.drafting.config = engine.config.replace(
                    num_draft_tokens=k, adaptive_drafts=False
                )
                engine.drafting.cost_aware = False
                t1, ids1, rate = decode_seconds(engine, p, new, f"s{a}{k}{i}")
                assert ids1 == ids0 == record, "drafted output differs from undrafted"
                if i:
                    base.append(t0)
                    spec.append(t1)
                    rates.append(rate)
            surface.append(
                {
                    "acceptance_set": a,
                    "k": k,
                    "acceptance_measured": statistics.median(rates),
                    "speedup": statistics.median(base) / statistics.median(spec),
                    "tok_s_undrafted": (new - 1) / statistics.median(base),
                    "tok_s_drafted": (new - 1) / statistics.median(spec),
                }
            )
            print("spec", surface[-1], flush=True)
    engine.proposer = None
    return {"new_tokens": new, "prompt_tokens": 128, "surface": surface}


def mixed_workload(
    engine: Engine, vocab: int, decoders: int, long_prompts: int, long_len: int, new: int, tag: str
) -> dict:
    params = SamplingParams(max_tokens=new, ignore_eos=True)
    ids = [
        engine.add_request(prompt(vocab, 64, 1000 + i), params, cache_salt=tag)
        for i in range(decoders)
    ]
    for _ in range(3):
        engine.step()
    long_ids = []
    done = {}
    start = time.perf_counter()
    step = 0
    while engine.has_work():
        if step % 4 == 0 and len(long_ids) < long_prompts:  # a long prompt arrives every 4 rounds
            long_ids.append(
                engine.add_request(
                    prompt(vocab, long_len, 2000 + len(long_ids)),
                    SamplingParams(max_tokens=8, ignore_eos=True),
                    cache_salt=tag,
                )
            )
        for c in engine.step():
            done[c.request_id] = c
        step += 1
    wall = time.perf_counter() - start
    ttft = [done[i].ttft for i in long_ids]
    gaps = [
        b - a
        for i in ids
        for a, b in zip(done[i].token_times, done[i].token_times[1:], strict=False)
    ]
    gaps.sort()
    return {
        "output_tok_s": sum(len(c.token_ids) for c in done.values()) / wall,
        "long_prompt_ttft_median_s": statistics.median(ttft),
        "itl_p50_s": gaps[len(gaps) // 2],
        "itl_p90_s": gaps[int(len(gaps) * 0.9)],
        "achieved_prefill_share": engine.metrics.achieved_prefill_share,
    }


def section_share(
    ckpt,
    cfg: EngineConfig,
    vocab: int,
    shares,
    decoders: int,
    long_prompts: int,
    long_len: int,
    new: int,
) -> dict:
    rows = []
    for s in shares:
        engine = build_engine(checkpoint=ckpt, config=cfg.replace(prefill_share=s))
        mixed_workload(engine, vocab, 2, 1, 256, 8, "warm")  # compile and capture first
        row = {
            "prefill_share": s,
            **mixed_workload(engine, vocab, decoders, long_prompts, long_len, new, f"share{s}"),
        }
        rows.append(row)
        print("share", row, flush=True)
        del engine
    return {
        "decoders": decoders,
        "long_prompts": long_prompts,
        "long_prompt_tokens": long_len,
        "rows": rows,
    }


def section_c64(engine: Engine, vocab: int, lanes: int, prompt_len: int, new: int) -> dict:
    params = SamplingParams(max_tokens=new, ignore_eos=True)
    engine.generate(
        [prompt(vocab, prompt_len, 5000 + i) for i in range(4)], params, cache_salt="warm64"
    )
    start = time.perf_counter()
    outs = engine.generate(
        [prompt(vocab, prompt_len, 6000 + i) for i in range(lanes)], params, cache_salt="c64"
    )
    wall = time.perf_counter() - start
    return {
        "lanes": lanes,
        "prompt_tokens": prompt_len,
        "new_tokens": new,
        "output_tok_s": sum(len(o.token_ids) for o in outs) / wall,
        "seconds": wall,
    }


def section_hf(config_name: str, device: str, new: int) -> dict:
    """transformers' own generate on the same shape (random init), batch 1, static cache."""
    import transformers

    from bench.shapes import SHAPES

    c = SHAPES[config_name]
    hf_cfg = transformers.LlamaConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_layers,
        num_attention_heads=c.num_heads,
        num_key_value_heads=c.num_kv_heads,
        head_dim=c.head_dim,
        max_position_embeddings=4096,
        tie_word_embeddings=c.tie_word_embeddings,
    )
    with torch.device(device):
        model = transformers.LlamaForCausalLM(hf_cfg).to(torch.bfloat16).eval()
    ids = torch.tensor([prompt(c.vocab_size, 128, 1)], device=device)
    out = {}
    for cache in ("static", "dynamic"):
        times = []
        for i in range(3):
            if device == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            model.generate(
                ids,
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
                cache_implementation=cache if cache == "static" else None,
                pad_token_id=0,
            )
            if device == "cuda":
                torch.cuda.synchronize()
            if i:
                times.append(time.perf_counter() - t)
        out[f"{cache}_cache_tok_s"] = new / statistics.median(times)
    del model
    return {
        "new_tokens": new,
        "prompt_tokens": 128,
        **out,
        "note": "eager (no torch.compile); includes the prefill",
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="llama-3.1-8b", choices=sorted(SHAPES))
    ap.add_argument("--drafter", default="llama-3.2-1b", choices=sorted(SHAPES))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--sections", default="spec,share,c64,hf")
    ap.add_argument("--tiny", action="store_true", help="small grids and lengths (CPU test)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--accs", default=None, help="spec: acceptances, e.g. 0.8 (default: a grid)")
    ap.add_argument("--ks", default=None, help="spec: draft lengths, e.g. 4 (default: a grid)")
    ap.add_argument(
        "--no-chain", action="store_true", help="spec: the drafter's steps as separate replays"
    )
    args = ap.parse_args()
    tiny = args.tiny
    tc, dc = SHAPES[args.target], SHAPES[args.drafter]
    tok = id_tokenizer(tc.vocab_size)
    ckpt = random_checkpoint(tc, args.device, tokenizer=tok)
    cfg = EngineConfig(
        device=args.device,
        kv_cache_bytes=(2**26 if tiny else 48 * 2**30),
        prompt_cache_bytes=0,
        max_lanes=64,
        max_tokens_per_round=8192,
        prefill_chunk=512,
    )
    report = {
        "target": args.target,
        "drafter": args.drafter,
        "device": torch.cuda.get_device_name() if args.device == "cuda" else args.device,
        "dtype": "bfloat16" if args.device == "cuda" else "float32",
    }
    out = Path(args.out or RESULTS / f"engine-{args.device}.json")
    sections = args.sections.split(",")
    if "spec" in sections or "c64" in sections:
        engine = build_engine(checkpoint=ckpt, config=cfg)
    if "spec" in sections:
        drafter = ModelDrafter(
            random_checkpoint(dc, args.device, seed=1, tokenizer=tok),
            tok,
            cfg.replace(draft_kv_cache_bytes=2**26 if tiny else 8 * 2**30),
        )
        if args.no_chain:
            drafter.chain = None
        report["chained"] = drafter.chain is not None
        accs, ks = ((0.5, 0.9), (1, 4)) if tiny else ((0.5, 0.6, 0.7, 0.8, 0.9), (1, 2, 4, 8))
        if args.accs:
            accs = tuple(float(a) for a in args.accs.split(","))
        if args.ks:
            ks = tuple(int(k) for k in args.ks.split(","))
        report["spec"] = section_spec(
            engine, drafter, tc.vocab_size, 16 if tiny else 128, 1 if tiny else 2, accs, ks
        )
        report["spec"]["peak_gib"] = peak_gib(args.device)
        out.write_text(json.dumps(report, indent=2) + "\n")
    if "c64" in sections:
        report["c64"] = section_c64(
            engine, tc.vocab_size, 8 if tiny else 64, 32 if tiny else 512, 8 if tiny else 256
        )
        report["c64"]["peak_gib"] = peak_gib(args.device)
        print("c64", report["c64"], flush=True)
        out.write_text(json.dumps(report, indent=2) + "\n")
    if "spec" in sections or "c64" in sections:
        del engine
    if "share" in sections:
        shares = (0.1, 0.9) if tiny else (0.1, 0.3, 0.5, 0.7, 0.9)
        report["share"] = section_share(
            ckpt,
            cfg,
            tc.vocab_size,
            shares,
            4 if tiny else 16,
            2 if tiny else 4,
            128 if tiny else 8192,
            16 if tiny else 96,
        )
        report["share"]["peak_gib"] = peak_gib(args.device)
        out.write_text(json.dumps(report, indent=2) + "\n")
    if "hf" in sections:
        try:
            report["hf"] = section_hf(args.target, args.device, 16 if tiny else 64)
        except Exception as e:  # a baseline that cannot run is recorded, not fatal
            report["hf"] = {"error": f"{type(e).__name__}: {e}"[:300]}
        print("hf", report["hf"], flush=True)
        out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
