"""Engine speed on random-weight models of real shapes: batch-1 decode and long-prompt prefill,
exact mode (Triton kernels) against fast mode (cuBLAS + SDPA), alternating, medians; in the same
run, the peers: gpt-fast's batch-1 decode (`--peers DIR`, the folder of ../shared/peers) and
transformers' own Llama forward with SDPA attention over the same prompt lengths (`--hf`).

    python -m bench.speed.decode_prefill [--device cuda] [--repeats 3] [--skip-32k] [--peers .peers] [--hf]
        [--decode-modes exact]

Writes bench/results/speed-<device>.json; bench/RESULTS.md quotes it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from bench import RESULTS
from bench.shapes import (
    LLAMA_31_8B,
    SMOLLM2_135M,
    hf_fields,
    hf_random_model,
    random_checkpoint,
    synthetic_prompt,
)
from lanes import Engine, EngineConfig, SamplingParams, build_engine


def weight_bytes(engine: Engine) -> int:
    """Weight bytes one decode step reads: every layer, the final norm and the LM head (the
    embedding table only where it is the LM head)."""
    w = engine.runner.decoder.weights
    tensors = [w.norm, w.lm_head] + [
        t for layer in w.layers for t in vars(layer).values() if t is not None
    ]
    unique = {t.data_ptr(): t for t in tensors}
    return sum(t.numel() * t.element_size() for t in unique.values())


def decode_tok_s(engine: Engine, vocab: int, new_tokens: int, seed: int) -> float:
    prompt = synthetic_prompt(vocab, 128, seed)
    (out,) = engine.generate(
        [prompt], SamplingParams(max_tokens=new_tokens, ignore_eos=True), cache_salt=f"d{seed}"
    )
    t = out.token_times
    return (len(t) - 1) / (t[-1] - t[0])


def prefill_s(engine: Engine, vocab: int, length: int, seed: int) -> float:
    prompt = synthetic_prompt(vocab, length, seed)
    (out,) = engine.generate(
        [prompt], SamplingParams(max_tokens=1, ignore_eos=True), cache_salt=f"p{seed}"
    )
    return out.ttft


def alternate(engines: dict, fn, repeats: int) -> dict:
    runs = {m: [] for m in engines}
    for i in range(repeats + 1):  # round 0 warms up (Triton compiles, allocator grows)
        for mode, engine in engines.items():
            value = fn(engine, i)
            if i:
                runs[mode].append(value)
    return {m: {"median": statistics.median(v), "runs": v} for m, v in runs.items()}


def gptfast_tok_s(peers: str, shapes: list[str], new_tokens: int) -> dict:
    """gpt-fast's batch-1 decode per shape, run by the peers' own runner in a child process (its
    torch.compile state and memory stay out of ours)."""
    cmd = [sys.executable, str(Path(peers) / "run_gptfast.py"), *shapes, "--new", str(new_tokens)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if done.returncode:
        raise RuntimeError(f"run_gptfast failed: {done.stderr[-2000:]}")
    lines = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
    return {x["shape"]: x for x in lines}


def hf_prefill_s(config, lengths: list[int], repeats: int) -> dict:
    """transformers' LlamaForCausalLM (random bf16 weights of the shape, SDPA attention): seconds
    of one forward over a prompt of each length, only the last position's logits, medians."""
    import transformers

    hf_config = transformers.LlamaConfig(
        **hf_fields(config),
        rope_theta=config.rope_theta,
        max_position_embeddings=max(lengths),
        attn_implementation="sdpa",
    )
    model = hf_random_model(transformers.LlamaForCausalLM, hf_config, "cuda")
    out = {}
    with torch.no_grad():
        for length in lengths:
            runs = []
            for i in range(repeats + 1):
                ids = torch.randint(0, config.vocab_size, (1, length), device="cuda")
                torch.cuda.synchronize()
                start = time.perf_counter()
                model(ids, logits_to_keep=1, use_cache=False)
                torch.cuda.synchronize()
                if i:
                    runs.append(time.perf_counter() - start)
            out[f"prefill_{length}_s"] = {"median": statistics.median(runs), "runs": runs}
    del model
    torch.cuda.empty_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--skip-32k", action="store_true")
    ap.add_argument("--peers", help="the peers folder (../shared/peers copied in): run gpt-fast")
    ap.add_argument("--hf", action="store_true", help="time transformers' SDPA prefill too")
    ap.add_argument(
        "--decode-modes",
        nargs="+",
        default=["exact", "fast"],
        choices=["exact", "fast"],
        help="modes whose decode is timed (fast mode decodes eagerly: 5-7 s a run on an H200)",
    )
    args = ap.parse_args()
    if "exact" not in args.decode_modes:
        ap.error("--decode-modes must include exact (the peers' ratios are against it)")
    out = RESULTS / f"speed-{args.device}.json"
    report = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else args.device,
        "torch": torch.__version__,
    }

    for name, config, prefills in (
        ("smollm2-135m", SMOLLM2_135M, []),
        ("llama-3.1-8b", LLAMA_31_8B, [8192] + ([] if args.skip_32k else [32768])),
    ):
        ckpt = random_checkpoint(config, args.device)
        base = dict(
            device=args.device,
            kv_cache_bytes=12 * 2**30,
            prompt_cache_bytes=0,
            prefill_chunk=32768,
            max_tokens_per_round=32768,
        )
        engines = {
            m: build_engine(checkpoint=ckpt, config=EngineConfig(exact=m == "exact", **base))
            for m in ("exact", "fast")
            if m in args.decode_modes or prefills  # prefill compares both modes
        }
        nbytes = weight_bytes(engines["exact"])
        dec = alternate(
            {m: engines[m] for m in args.decode_modes},
            lambda e, i, v=config.vocab_size: decode_tok_s(e, v, args.new_tokens, i),
            args.repeats,
        )
        for m in dec:
            dec[m]["weight_GB_per_s"] = dec[m]["median"] * nbytes / 1e9
        entry = {
            "dtype": "bfloat16",
            "batch": 1,
            "prompt_tokens": 128,
            "new_tokens": args.new_tokens,
            "weight_bytes": nbytes,
            "decode_tok_s": dec,
        }
        for length in prefills:
            entry[f"prefill_{length}_s"] = alternate(
                engines,
                lambda e, i, n=length, v=config.vocab_size: prefill_s(e, v, n, 100 + i),
                args.repeats,
            )
        report[name] = entry
        del engines
        torch.cuda.empty_cache()
        if args.hf and prefills:
            entry["hf_sdpa"] = hf_prefill_s(config, prefills, args.repeats)
            for length in prefills:
                key = f"prefill_{length}_s"
                entry[f"{key}_exact_over_hf"] = (
                    entry[key]["exact"]["median"] / entry["hf_sdpa"][key]["median"]
                )
        print(name, json.dumps(entry, indent=1), flush=True)
        out.write_text(json.dumps(report, indent=2) + "\n")  # kept if a later part runs out of time
    if args.peers:
        peer = gptfast_tok_s(args.peers, ["smollm2-135m", "llama-3.1-8b"], args.new_tokens)
        for name, run in peer.items():
            lanes_tok_s = report[name]["decode_tok_s"]["exact"]["median"]
            report[name]["gptfast_tok_s"] = run["decode_tok_s_median"]
            report[name]["exact_over_gptfast"] = lanes_tok_s / run["decode_tok_s_median"]
            print(name, "gpt-fast", run["decode_tok_s_median"], "lanes exact", lanes_tok_s)
    out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
