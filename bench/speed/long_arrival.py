"""A long prompt arriving among decoding lanes (issue 42 item 2): what it does to their
inter-token latency, and how long it waits for its first token.

    python -m bench.speed.long_arrival [--shape llama-3.1-8b] [--decoders 63]
        [--long-prompt 32768] [--prefill-share S[,S...]] [--no-prefill-bursts]
        [--no-mixed-graphs] [--out FILE]

`decoders` lanes (128-token prompts) decode; once all of them have decoded `--steady` tokens, one
prompt of `--long-prompt` tokens arrives. The decoders' gaps between tokens before it arrived
are the baseline (their median "without it"); their gaps from its arrival to its first token
are the gaps it caused (p50, p99, max, and p99 over the baseline median, the issue's target
being <= 1.5). Its time to first token beside the time a prompt of that length takes alone
tells what the protection costs it. Several shares (`--prefill-share 0.5,0.3`) run one after
another on one checkpoint, an engine each. Random weights of the shape (bf16 on a GPU, float32 on
the CPU), exact mode, CUDA graphs where they run; greedy. On the CPU, use a small shape
(`--shape tiny --decoders 7 --long-prompt 1024`).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from pathlib import Path

import torch

from bench.shapes import SHAPES, id_tokenizer, random_checkpoint, synthetic_prompt
from bench.stats import percentile
from lanes import EngineConfig, SamplingParams, build_engine


def run(engine, args) -> dict:
    vocab = engine.model_config.vocab_size
    decode = SamplingParams(max_tokens=args.decoder_tokens, ignore_eos=True)
    decoders = [
        engine.add_request(synthetic_prompt(vocab, 128, 100 + i), decode)
        for i in range(args.decoders)
    ]
    lanes = {lane.request_id: lane for lane in engine.running + engine.waiting}
    while min(len(lanes[r].token_times) for r in decoders) < args.steady:
        engine.step()
    long_params = SamplingParams(max_tokens=2, ignore_eos=True)
    long_id = engine.add_request(synthetic_prompt(vocab, args.long_prompt, 7), long_params)
    long_lane = next(ln for ln in engine.running + engine.waiting if ln.request_id == long_id)
    rounds_before = engine.metrics.num_rounds
    replays_before = _mixed_replays(engine)
    while not long_lane.token_times:
        engine.step()
    mixed_rounds = engine.metrics.num_rounds - rounds_before
    # the rounds until its first token (the metrics keep the last 1,024)
    rounds = list(engine.metrics.recent)[-mixed_rounds:]
    with_prompt = [r for r in rounds if r.prefill_tokens]
    arrival, first = long_lane.arrival_time, long_lane.token_times[0]
    before, during = [], []
    for r in decoders:
        times = lanes[r].token_times
        for t1, t2 in zip(times, times[1:], strict=False):
            if t2 <= arrival:
                before.append(t2 - t1)
            elif t1 >= arrival and t2 <= first:
                during.append(t2 - t1)
    for r in decoders:  # the rest is not measured
        engine.cancel(r)
    while engine.has_work():
        engine.step()
    baseline = statistics.median(before)
    return {
        "itl_median_before_s": baseline,
        "itl_during_s": {
            "p50": statistics.median(during),
            "p99": percentile(during, 0.99),
            "max": max(during),
            "gaps": len(during),
        },
        "p99_over_median": percentile(during, 0.99) / baseline,
        "long_ttft_s": first - arrival,
        "rounds_until_first_token": mixed_rounds,
        "rounds_with_prompt_work": {
            "count": len(with_prompt),
            "prompt_tokens_p50": statistics.median(r.prefill_tokens for r in with_prompt),
            "seconds_p50": statistics.median(r.seconds for r in with_prompt),
            "seconds_p99": percentile([r.seconds for r in with_prompt], 0.99),
            "mixed_graph_replays": _mixed_replays(engine) - replays_before,
        }
        if with_prompt
        else None,
        "achieved_prefill_share": engine.metrics.achieved_prefill_share,
    }


def _mixed_replays(engine) -> int:
    mixed = engine.runner.mixed
    return 0 if mixed is None else mixed.num_replays


def alone_prefill_s(engine, length: int) -> float:
    """The long prompt alone (nothing decoding), for its TTFT beside the decoders."""
    params = SamplingParams(max_tokens=1, ignore_eos=True)
    prompt = synthetic_prompt(engine.model_config.vocab_size, length, 8)
    start = time.perf_counter()
    engine.generate([prompt], params, cache_salt="alone")
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="llama-3.1-8b", choices=sorted(SHAPES))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--decoders", type=int, default=63)
    ap.add_argument("--decoder-tokens", type=int, default=4096)
    ap.add_argument("--steady", type=int, default=32, help="tokens each decoder has first")
    ap.add_argument("--long-prompt", type=int, default=32768)
    ap.add_argument("--prefill-share", default=str(EngineConfig.prefill_share))
    ap.add_argument("--prefill-bursts", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--mixed-graphs", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--max-tokens-per-round", type=int, default=8192)
    ap.add_argument("--prefill-chunk", type=int, default=512)
    ap.add_argument("--kv-gib", type=float, default=24.0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    shape = SHAPES[args.shape]
    checkpoint = random_checkpoint(shape, args.device, tokenizer=id_tokenizer(shape.vocab_size))
    reports = []
    for share in [float(x) for x in args.prefill_share.split(",")]:
        engine = build_engine(
            checkpoint=checkpoint,
            config=EngineConfig(
                device=args.device,
                kv_cache_bytes=int(args.kv_gib * 2**30),
                prompt_cache_bytes=0,
                max_lanes=args.decoders + 1,
                max_tokens_per_round=args.max_tokens_per_round,
                prefill_chunk=args.prefill_chunk,
                prefill_share=share,
                prefill_bursts=args.prefill_bursts,
                mixed_graphs=args.mixed_graphs,
            ),
        )
        alone_prefill_s(engine, min(args.long_prompt, 1024))  # warm: captures, compiled kernels
        report = {
            "device": torch.cuda.get_device_name() if args.device == "cuda" else args.device,
            "shape": args.shape,
            "decoders": args.decoders,
            "long_prompt": args.long_prompt,
            "prefill_share": share,
            "prefill_bursts": args.prefill_bursts,
            "mixed_graphs": args.mixed_graphs and engine.runner.mixed is not None,
            "long_prompt_alone_s": alone_prefill_s(engine, args.long_prompt),
            **run(engine, args),
        }
        print(json.dumps(report, indent=1), flush=True)
        reports.append(report)
        del engine
        gc.collect()  # the engine's cycles hold its caches until collected
        if args.device == "cuda":
            torch.cuda.empty_cache()
    report = reports[0] if len(reports) == 1 else reports
    out = Path(args.out or f"bench/results/long-arrival-{args.shape}-{args.device}.json")
    out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
