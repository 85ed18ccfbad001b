"""What sampled (temperature > 0) requests cost on the GPU: the position-keyed sampling kernel per
launch (with its host work, and on the device alone: replayed as a CUDA graph) against the host
path's row-by-row sampling, and decode with seeded requests against
greedy ones in the engine. Random bf16 weights of real shapes, exact mode, CUDA graphs.

    python -m bench.kernels.sampling --part kernel [--out FILE]
    python -m bench.kernels.sampling --part engine [--out FILE] [--new-tokens 128]

The engine part runs on any tree that has bench.shapes (so a checkout of an older commit can be
timed in the same call); the kernel part needs lanes.kernels.sampling.sample_tokens.

Kernel logits are Zipf-like (log-probabilities of a power law over a random order, plus noise,
rounded through bf16 as an LM head writes them), so top-p sets have the sizes real models give.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import time
from pathlib import Path

import torch

from bench.kernels.matmul import event_us

# (label, temperature, top_k, top_p): greedy, OpenAI's defaults, and common sampler settings
SETTINGS = [
    ("greedy", 0.0, 0, 1.0),
    ("T1.0", 1.0, 0, 1.0),
    ("T0.7 top_p0.9", 0.7, 0, 0.9),
    ("T0.8 top_k50", 0.8, 50, 1.0),
    ("T0.7 top_k40 top_p0.95", 0.7, 40, 0.95),
]


def zipf_logits(rows: int, vocab: int, seed: int, device: str) -> torch.Tensor:
    """[rows, vocab] float32 logits of a power law (exponent 1.1) over a random token order."""
    gen = torch.Generator().manual_seed(seed)
    ranks = torch.arange(1, vocab + 1, dtype=torch.float32)
    out = []
    for _ in range(rows):
        logp = -1.1 * torch.log(ranks) + 0.5 * torch.randn(vocab, generator=gen)
        out.append(logp[torch.randperm(vocab, generator=gen)] * 1.5)
    return torch.stack(out).to(torch.bfloat16).float().to(device)


def graph_median_us(logits, temp, top_k, top_p, seeds, positions, reps: int = 20) -> float:
    """Device time of one sampling launch alone: the kernel captured in a CUDA graph (device
    parameters, no host work) and its replays timed with events."""
    from lanes.kernels.sampling import RowParams, sample_with

    params = RowParams.upload(temp.tolist(), top_k.tolist(), top_p.tolist(), seeds, "cuda")
    where = torch.tensor(positions, dtype=torch.int64, device="cuda")
    sample_with(logits, params, where)  # compiled before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sample_with(logits, params, where)
    return event_us(graph.replay, reps)


def kernel_part() -> dict:
    from lanes.kernels.sampling import greedy_tokens, ref_sample_tokens, sample_tokens

    report = {}
    for vocab in (49152, 128256):
        for rows in (1, 64):
            logits = zipf_logits(rows, vocab, vocab + rows, "cuda")
            seeds = list(range(11, 11 + rows))
            positions = list(range(500, 500 + rows))
            for label, t, k, p in SETTINGS:
                temp = torch.full((rows,), t)
                top_k = torch.full((rows,), k, dtype=torch.int64)
                top_p = torch.full((rows,), p)
                args = (logits, temp, top_k, top_p, seeds, positions)
                got = sample_tokens(*args)
                want = ref_sample_tokens(*args)
                equal = torch.equal(got[0].cpu(), want[0].cpu())
                if label == "greedy":
                    kernel = event_us(lambda x=logits: greedy_tokens(x), 30)
                else:
                    kernel = event_us(lambda a=args: sample_tokens(*a), 30)
                device = graph_median_us(logits, temp, top_k, top_p, seeds, positions)
                # the host path of the old engine: one row at a time, read back each
                host = []
                for _ in range(5):
                    torch.cuda.synchronize()
                    start = time.perf_counter()
                    ref_sample_tokens(*args)
                    torch.cuda.synchronize()
                    host.append((time.perf_counter() - start) * 1e6)
                key = f"V{vocab} R{rows} {label}"
                report[key] = {
                    "launch_us": kernel,
                    "device_us": device,
                    "host_rows_us": statistics.median(host),
                    "tokens_equal_reference": equal,
                }
                print(
                    f"{key:34s} launch {kernel:7.1f} us  device {device:7.1f} us  "
                    f"host path {statistics.median(host):9.1f} us"
                    f"   equal {equal}",
                    flush=True,
                )
    return report


def run_requests(engine, prompts, params, salt: str) -> tuple[float, list]:
    """Decode tok/s (batch 1: between the first and the last token; more lanes: output tokens
    over the wall time) and the completions."""
    ids = [engine.add_request(q, p, cache_salt=salt) for q, p in zip(prompts, params, strict=True)]
    done = {}
    start = time.perf_counter()
    while engine.has_work():
        done.update((c.request_id, c) for c in engine.step())
    wall = time.perf_counter() - start
    outs = [done[i] for i in ids]
    if len(outs) == 1:
        t = outs[0].token_times
        return (len(t) - 1) / (t[-1] - t[0]), outs
    return sum(len(o.token_ids) for o in outs) / wall, outs


def engine_part(new_tokens: int) -> dict:
    import dataclasses

    from bench.shapes import LLAMA_31_8B, SMOLLM2_135M, random_checkpoint, synthetic_prompt
    from lanes import EngineConfig, SamplingParams, build_engine

    config = EngineConfig(
        device="cuda", kv_cache_bytes=24 * 2**30, prompt_cache_bytes=0, max_lanes=64
    )
    sampled = SamplingParams(max_tokens=new_tokens, ignore_eos=True, temperature=0.7, top_p=0.9)
    greedy = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    report = {}
    cases = [
        ("smollm2-135m", SMOLLM2_135M, 1),
        ("llama-3.1-8b", LLAMA_31_8B, 1),
        ("llama-3.1-8b", LLAMA_31_8B, 64),
    ]
    built = {}
    for name, shape, lanes in cases:
        if name not in built:
            built.clear()
            torch.cuda.empty_cache()
            built[name] = build_engine(checkpoint=random_checkpoint(shape, "cuda"), config=config)
        engine = built[name]
        prompts = [synthetic_prompt(shape.vocab_size, 128, 7 + i) for i in range(lanes)]
        for label, base in (("greedy", greedy), ("T0.7 top_p0.9", sampled)):
            per = [
                dataclasses.replace(base, seed=1000 + i) if base.temperature else base
                for i in range(lanes)
            ]

            run_requests(engine, prompts, per, "warm")
            rates, digests = [], set()
            for r in range(3):
                rate, outs = run_requests(engine, prompts, per, f"run{r}")
                rates.append(rate)
                digests.add(
                    hashlib.sha256(json.dumps([o.token_ids for o in outs]).encode()).hexdigest()[
                        :16
                    ]
                )
            key = f"{name} lanes{lanes} {label}"
            report[key] = {
                "tok_s": statistics.median(rates),
                "runs": rates,
                "outputs": sorted(digests),
            }
            print(
                f"{key:40s} {statistics.median(rates):9.1f} tok/s  outputs {sorted(digests)}",
                flush=True,
            )
    return report


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--part", choices=("kernel", "engine"), required=True)
    ap.add_argument("--out", default=None)
    ap.add_argument("--new-tokens", type=int, default=128)
    args = ap.parse_args()
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "part": args.part}
    report.update(kernel_part() if args.part == "kernel" else engine_part(args.new_tokens))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
