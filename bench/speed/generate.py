"""Batch-1 generation speed of the engine, exact vs fast ops, on any model and device.

    python bench/speed/generate.py [--model M] [--device cpu] [--new-tokens 64] [--repeats 5]
        [--modes exact,fast] [--dtypes auto]      (e.g. --modes exact --dtypes float32,bfloat16)
        [--row-tiles 16,2]     (exact mode on the CPU: the linears' fixed row tile, lanes.ops.ROW_TILE)
        [--weight-major on,off]  (exact mode on the CPU: weight @ tile.T or tile @ weight.T,
                                  lanes.ops.WEIGHT_MAJOR)
        [--prefill 1000]       (also: time to first token of a fresh prompt of that many tokens)
        [--context 1500]       (also: decode tok/s after a cached prompt of that many tokens)
        [--gguf-packed off,on] (a .gguf's Q4/Q8 weights dequantized at load or kept packed)

Prints a table and writes bench/results/generate-<device>.json. Modes alternate (A B A B) so drift
hits both; the first run of each mode is a warm-up and is dropped.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

from bench import RESULTS
from lanes import EngineConfig, SamplingParams, build_engine, ops
from lanes.build import keeps_gguf_packed
from lanes.models import open_checkpoint

PROMPT = [{"role": "user", "content": "Write a short story about a lighthouse keeper."}]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--modes", default="exact,fast")
    ap.add_argument("--dtypes", default="auto", help="comma-separated: auto, float32, bfloat16")
    ap.add_argument("--row-tiles", default=None, help="comma-separated ROW_TILE values to compare")
    ap.add_argument("--weight-major", default=None, help="comma-separated on/off to compare")
    ap.add_argument("--prefill", type=int, default=0, help="also time a fresh N-token prompt")
    ap.add_argument("--context", type=int, default=0, help="also decode after an N-token prompt")
    ap.add_argument("--gguf-packed", default=None, help="comma-separated off/on to compare")
    args = ap.parse_args()

    default_packing = keeps_gguf_packed(EngineConfig(device=args.device))  # exact mode's
    packings = (
        [p == "on" for p in args.gguf_packed.split(",")] if args.gguf_packed else [default_packing]
    )
    ckpts = {packing: open_checkpoint(args.model, packing) for packing in packings}
    ckpt = ckpts[packings[0]]
    dtypes = args.dtypes.split(",")
    tiles = [int(t) for t in args.row_tiles.split(",")] if args.row_tiles else [ops.ROW_TILE]
    forms = (
        [f == "on" for f in args.weight_major.split(",")]
        if args.weight_major
        else [ops.WEIGHT_MAJOR]
    )
    engines, row_tile, weight_major = {}, {}, {}
    for mode in args.modes.split(","):
        for dtype in dtypes:
            for tile in tiles:
                for form in forms:
                    for packing in packings:
                        name = mode + (f"-{dtype}" if len(dtypes) > 1 else "")
                        name += f"-tile{tile}" if len(tiles) > 1 else ""
                        name += (
                            ("-weight-major" if form else "-rows-major") if len(forms) > 1 else ""
                        )
                        name += ("-packed" if packing else "-float") if len(packings) > 1 else ""
                        engines[name] = build_engine(
                            checkpoint=ckpts[packing],
                            config=EngineConfig(
                                device=args.device, exact=mode == "exact", dtype=dtype
                            ),
                        )
                        # each engine its own prompt cache: no KV crosses tiles or forms
                        row_tile[name], weight_major[name] = tile, form
    params = SamplingParams(max_tokens=args.new_tokens, ignore_eos=True)
    times: dict[str, list[float]] = {m: [] for m in engines}
    ttfts: dict[str, list[float]] = {m: [] for m in engines}
    long_rates: dict[str, list[float]] = {m: [] for m in engines}
    context_prompt = [(37 * i) % 40000 + 100 for i in range(args.context)]
    long_prompt = [(7 * i) % 1000 + 10 for i in range(args.prefill)]  # token ids, no template
    prompt_len = 0
    for i in range(args.repeats + 1):
        for mode, engine in engines.items():
            ops.ROW_TILE, ops.WEIGHT_MAJOR = row_tile[mode], weight_major[mode]
            start = time.perf_counter()
            (out,) = engine.generate([PROMPT], params)
            if i > 0:
                times[mode].append(time.perf_counter() - start)
            prompt_len = len(out.prompt_ids)
            if args.prefill and i > 0:  # a fresh prompt each time: nothing from the cache
                first = SamplingParams(max_tokens=1, ignore_eos=True)
                (out,) = engine.generate([long_prompt], first, cache_salt=f"prefill{i}")
                ttfts[mode].append(out.ttft)
            if args.context:  # the prompt is cached from the warm-up run on: decode alone
                (out,) = engine.generate([context_prompt], params, cache_salt="context")
                t = out.token_times
                if i > 0:
                    long_rates[mode].append((len(t) - 1) / (t[-1] - t[0]))
    rows = {
        mode: {
            "median_s": statistics.median(t),
            "tok_per_s": args.new_tokens / statistics.median(t),
            "runs_s": t,
            **(
                {f"prefill_{args.prefill}_s": statistics.median(ttfts[mode])}
                if args.prefill
                else {}
            ),
            **(
                {f"decode_after_{args.context}_tok_s": statistics.median(long_rates[mode])}
                if args.context
                else {}
            ),
        }
        for mode, t in times.items()
    }
    result = {
        "machine": f"{platform.machine()} {platform.processor() or ''} {torch.get_num_threads()} threads",
        "device": args.device,
        "model": ckpt.source,
        "dtypes": {m: e.config.torch_dtype_name for m, e in engines.items()},
        "weight_mib": {m: e.runner.decoder.weights.nbytes / 2**20 for m, e in engines.items()},
        "batch": 1,
        "prompt_tokens": prompt_len,
        "new_tokens": args.new_tokens,
        "torch": torch.__version__,
        "modes": rows,
    }
    print(
        f"{'mode':6} {'median s':>9} {'tok/s':>7}   (prompt {prompt_len}, {args.new_tokens} new, batch 1)"
    )
    for mode, r in rows.items():
        extra = (
            f"   prefill {args.prefill}: {r[f'prefill_{args.prefill}_s']:.2f} s"
            if args.prefill
            else ""
        )
        if args.context:
            extra += f"   decode after {args.context}: "
            extra += f"{r[f'decode_after_{args.context}_tok_s']:.1f} tok/s"
        print(f"{mode:14} {r['median_s']:9.3f} {r['tok_per_s']:7.1f}{extra}")
    result["row_tiles"], result["weight_major"] = row_tile, weight_major
    plain = (
        args.modes == "exact,fast"
        and args.dtypes == "auto"
        and len(tiles) == len(forms) == len(packings) == 1
    )
    tag = "" if plain else "-" + "-".join(engines)
    out = RESULTS / f"generate-{args.device}{tag}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
