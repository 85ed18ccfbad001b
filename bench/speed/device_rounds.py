"""Drafted rounds kept on the device (lanes/device_rounds.py) against host-managed drafted
rounds and plain decode, in one run on one GPU, at a set acceptance.

    python -m bench.speed.device_rounds [--shape smollm2-135m] [--acceptance 0.8] [--k 4]
        [--lanes 1,4] [--new 256] [--repeats 3] [--temperature T --top-p P] [--out FILE]

Random weights of the shape (exact mode, CUDA graphs); the drafter is the shipped SmolLM2 head
(it reads the random target's shared embedding), or with `--drafter random` an untrained head of
the shape's own width drafting over `--head-vocab` token ids (an untied shape gets tied
embeddings, which the head's LM head reads), run for its cost. Its drafts are replaced by
the target's own tokens at a set acceptance, so the rounds keep what a good head would keep:
host-managed rounds with replay drafts (bench_engine.CostedReplay), device rounds with the same
rate decided on the device by position (each position's draft right with probability p, from
a fixed random table). Each lane count runs the three modes alternating, `repeats` times;
decode tok/s per lane is (tokens - 1) / (last token time - first token time), medians. One
profiled window per mode gives wall and kernel time per engine step (torch.profiler).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from pathlib import Path

import torch

from bench.profile.busy import kernel_spans
from bench.profile.spec_round import SHIPPED, print_host_profile
from bench.shapes import SHAPES, random_checkpoint, synthetic_prompt
from bench.speed.engine import CostedReplay
from lanes import EngineConfig, SamplingParams, build_engine
from lanes.drafter import make_proposer
from lanes.drafter.replay import ReplayProposer


def random_head(ckpt, vocab: int, out: Path, device: str = "cuda") -> Path:
    """An untrained EAGLE-style head for `ckpt` (one layer of its shape, drafting over its first
    `vocab` token ids), saved as `lanes distill` saves one: it costs what a trained head of
    that shape costs (its drafts are replaced anyway, `kept_drafts`)."""
    from lanes.config import ModelConfig
    from lanes.drafter.distill import EagleHead, hf_config, save

    cfg = ModelConfig.from_hf(hf_config(ckpt.config, num_layers=1))
    vocab_ids = torch.arange(min(vocab, ckpt.config.vocab_size))
    save(EagleHead(cfg, ckpt, vocab_ids, device), cfg, out)
    (out / "drafter.json").write_text(json.dumps({"kind": "eagle", "target_feature_layers": None}))
    return out


def kept_drafts(rounds, truth: torch.Tensor, p: float, vocab: int) -> None:
    """Make the device rounds' drafts the true token with probability p by position: the head
    still samples (its cost stays), then each draft is replaced on the device."""
    keep = torch.rand(truth.shape[0], generator=torch.Generator().manual_seed(7)) < p
    keep = keep.to(truth.device)
    head_sample = rounds.sample

    def sample(logits, positions, params):
        own = head_sample(logits, positions, params)
        right = truth[positions]
        wrong = torch.where(own == right, (right + 1) % vocab, own)
        return torch.where(keep[positions], right, wrong)

    rounds.sample = sample
    rounds.buckets.clear()  # captured at start with the head's own sampler: capture them again


def gaps(spans) -> tuple[float, float, float]:
    """(ms of kernels: the union of their intervals, ms idle in gaps < 20 µs (between a
    graph's kernels), ms idle in longer gaps (waiting for the host))."""
    covered = small = large = 0.0
    end = None
    for a, b in spans:
        if end is not None and a > end:
            if a - end < 20.0:
                small += a - end
            else:
                large += a - end
        if end is None or b > end:
            covered += b - (a if end is None else max(a, end))
            end = b
    return covered / 1e3, small / 1e3, large / 1e3


def decode_tok_s(done) -> float:
    rates = []
    for c in done:
        span = c.token_times[-1] - c.token_times[0]
        rates.append((len(c.token_ids) - 1) / span)
    return statistics.median(rates)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="smollm2-135m", choices=sorted(SHAPES))
    ap.add_argument(
        "--drafter", default=str(SHIPPED), help="a head directory, or random (of the shape)"
    )
    ap.add_argument("--head-vocab", type=int, default=32768, help="--drafter random's vocab")
    ap.add_argument("--acceptance", type=float, default=0.8)
    ap.add_argument("--temperature", type=float, default=0.0, help="> 0: seeded requests")
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--lanes", default="1,4")
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--profile-steps", type=int, default=30)
    ap.add_argument("--cprofile", type=int, default=0, help="then N device rounds under cProfile")
    ap.add_argument("--out", default="bench/results/device-rounds-h200.json")
    args = ap.parse_args()
    shape = SHAPES[args.shape]
    if args.drafter == "random" and not shape.tie_word_embeddings:
        # the head's LM head is the target's embedding: tie it (the same bytes per token)
        shape = dataclasses.replace(shape, tie_word_embeddings=True)
    ckpt = random_checkpoint(shape, "cuda")
    if args.drafter == "random":
        import tempfile

        head_dir = Path(tempfile.mkdtemp(prefix="lanes-head-")) / "eagle"
        args.drafter = str(random_head(ckpt, args.head_vocab, head_dir))
    base = dict(
        device="cuda",
        prompt_cache_bytes=0,
        num_draft_tokens=args.k,
        adaptive_drafts=False,
        cost_aware_drafts=False,
        max_lanes=64,
    )
    prompt = synthetic_prompt(shape.vocab_size, 128, 3)
    params = SamplingParams(
        max_tokens=args.new,
        ignore_eos=True,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=1 if args.temperature else None,
    )
    plain_engine = build_engine(checkpoint=ckpt, config=EngineConfig(**base))
    (ref,) = plain_engine.generate([prompt], params)
    truth = torch.zeros(len(prompt) + args.new + 4 * args.k + 8, dtype=torch.int64)
    truth[len(prompt) : len(prompt) + len(ref.token_ids)] = torch.tensor(ref.token_ids)
    truth = truth.to("cuda")

    replay = ReplayProposer({tuple(prompt): ref.token_ids}, args.acceptance, shape.vocab_size)
    host_cfg = EngineConfig(**base, device_rounds=False)
    host_head = make_proposer(args.drafter, host_cfg, ckpt)
    host_engine = build_engine(
        checkpoint=ckpt, config=host_cfg, proposer=CostedReplay(replay, host_head)
    )
    dev_cfg = EngineConfig(**base, drafter=args.drafter)
    dev_engine = build_engine(checkpoint=ckpt, config=dev_cfg)
    if dev_engine.device_rounds is None:
        raise SystemExit("device rounds did not start on this machine (CUDA graphs needed)")
    kept_drafts(dev_engine.device_rounds, truth, args.acceptance, shape.vocab_size)
    modes = {
        "plain": (plain_engine, dict(draft=False)),
        "host_rounds": (host_engine, {}),
        "device_rounds": (dev_engine, {}),
    }
    report = {
        "shape": args.shape,
        "drafter": args.drafter,
        "acceptance_set": args.acceptance,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "k": args.k,
        "new_tokens": args.new,
        "prompt_tokens": len(prompt),
        "gpu": torch.cuda.get_device_name(),
        "rows": [],
    }
    for lanes in [int(n) for n in args.lanes.split(",")]:
        prompts = [prompt] * lanes
        runs = {m: [] for m in modes}
        equal = {}
        for _ in range(args.repeats + 1):  # the first pass captures graphs: not counted
            for name, (engine, extra) in modes.items():
                done = engine.generate(prompts, dataclasses.replace(params, **extra))
                equal[name] = all(c.token_ids == ref.token_ids for c in done)
                steps = sum(c.num_target_steps for c in done)
                runs[name].append((decode_tok_s(done), sum(len(c.token_ids) for c in done) / steps))
        row = {"lanes": lanes}
        for name in modes:
            rates = [r[0] for r in runs[name][1:]]
            row[name] = {"decode_tok_s_per_lane": statistics.median(rates), "runs": rates}
            row[name]["tokens_per_target_step"] = runs[name][-1][1]
            row[name]["outputs_equal_plain"] = equal[name]
        # one profiled window per mode: wall and kernel time per engine step
        for name, (engine, extra) in modes.items():
            lanes_ = [
                engine.submit(prompt, dataclasses.replace(params, **extra)) for _ in range(lanes)
            ]
            while min(len(x.output_ids) for x in lanes_) < 16:
                engine.step()
            before = [len(x.output_ids) for x in lanes_]
            wall, spans = kernel_spans(engine, args.profile_steps)
            kernels, small, large = gaps(spans)
            made = sum(len(x.output_ids) - b for x, b in zip(lanes_, before, strict=True))
            while engine.has_work():
                engine.step()
            row[name]["profile"] = {
                "wall_ms_per_step": wall / args.profile_steps * 1e3,
                "kernel_ms_per_step": kernels / args.profile_steps,
                "gaps_under_20us_ms_per_step": small / args.profile_steps,
                "gaps_over_20us_ms_per_step": large / args.profile_steps,
                "kernels_per_step": len(spans) / args.profile_steps,
                "tokens_per_step_per_lane": made / args.profile_steps / lanes,
            }
        plain = row["plain"]["decode_tok_s_per_lane"]
        for name in ("host_rounds", "device_rounds"):
            row[name]["speedup"] = row[name]["decode_tok_s_per_lane"] / plain
        report["rows"].append(row)
        print(json.dumps(row, indent=1), flush=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    if args.cprofile:  # where the host's time per device round goes, one lane
        lane = dev_engine.submit(prompt, params)
        while len(lane.output_ids) < 16:
            dev_engine.step()
        print_host_profile(dev_engine, args.cprofile)
        while dev_engine.has_work():
            dev_engine.step()


if __name__ == "__main__":
    main()
