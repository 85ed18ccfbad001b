"""Cancellation receipt: a long prompt is cancelled after t seconds, once and then again, then
retried. Prints the tokens the prompt cache kept after each cancellation, the retry's TTFT
against a fresh run's, and whether the outputs' token SHA-256 match.

    python bench/serving/cancel_receipt.py [--model M] [--device cpu] [--prompt-tokens 2048] [--after 1.0]
    python -m bench.serving.cancel_receipt --device cuda --shape llama-3.1-8b --prompt-tokens 32768 \
        --prefill-chunk 2048

Writes bench/results/cancel-receipt-<device>.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import pydoc_data.topics
import time

import torch

from bench import RESULTS
from lanes import Engine, EngineConfig, SamplingParams, build_engine


def sha(ids: list[int]) -> str:
    return hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:16]


def run(
    engine: Engine, prompt: list[int], params, salt: str = "", cancel_after: float | None = None
):
    """Run to the end or cancel `cancel_after` seconds in; returns (completion, ttft seconds,
    the cancel: when it fired, the tokens counted as computed then, and how long the engine
    took from there to end the request)."""
    start = time.perf_counter()
    rid = engine.add_request(prompt, params, cache_salt=salt)
    fired: dict = {}

    def check(r: int) -> bool:
        if r != rid or time.perf_counter() - start <= cancel_after:
            return False
        lane = next(x for x in engine.running + engine.waiting if x.request_id == rid)
        fired.setdefault("at", time.perf_counter())
        fired.setdefault("computed", lane.num_computed)
        return True

    if cancel_after is not None:
        engine.cancel_check = check
    try:
        while True:
            for c in engine.step():
                if c.request_id == rid:
                    if fired:
                        fired["ended_after_s"] = time.perf_counter() - fired.pop("at")
                    ttft = c.token_times[0] - start if c.token_times else None
                    return c, ttft, fired
    finally:
        engine.cancel_check = None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--prompt-tokens", type=int, default=2048)
    ap.add_argument("--after", type=float, default=1.0, help="seconds before each cancellation")
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--shape", default=None, help="a random-weight model of this shape (GPU)")
    ap.add_argument("--prefill-chunk", type=int, default=128)
    args = ap.parse_args()

    config = EngineConfig(device=args.device, prefill_chunk=args.prefill_chunk)
    if args.shape:  # no weights on the GPU machine: a random model of a real shape
        from bench.shapes import SHAPES, id_tokenizer, random_checkpoint, synthetic_prompt

        shape = SHAPES[args.shape]
        ckpt = random_checkpoint(shape, args.device, tokenizer=id_tokenizer(shape.vocab_size))
        config = config.replace(kv_cache_bytes=32 * 2**30, prompt_cache_bytes=16 * 2**30)
        engine = build_engine(checkpoint=ckpt, config=config)
        prompt = synthetic_prompt(shape.vocab_size, args.prompt_tokens, 7)
    else:
        engine = build_engine(args.model, config)
        text = " ".join(pydoc_data.topics.topics.values())
        prompt = engine.tokenizer.encode(text)[: args.prompt_tokens]
    params = SamplingParams(max_tokens=args.new_tokens, ignore_eos=True)

    fresh, fresh_ttft, _ = run(engine, prompt, params, salt="fresh")
    rows = []
    for attempt in (1, 2):
        out, _, fired = run(engine, prompt, params, cancel_after=args.after)
        kept = engine.cached_prefix_len(prompt)
        rows.append(
            {
                "cancellation": attempt,
                "finish": out.finish_reason,
                "kept_tokens": kept,
                # counted as computed when the cancel fired (a chunk may still have been in
                # flight: the engine waits for it and keeps it too), and the wait
                "computed_at_cancel": fired.get("computed"),
                "cancel_to_end_s": fired.get("ended_after_s"),
            }
        )
    retry, retry_ttft, _ = run(engine, prompt, params)
    result = {
        "machine": f"{platform.machine()} {torch.get_num_threads()} threads, {args.device}",
        "model": engine.source,
        "dtype": engine.config.torch_dtype_name,
        "prompt_tokens": len(prompt),
        "cancel_after_s": args.after,
        "cancellations": rows,
        "retry_cached_tokens": retry.cached_tokens,
        "fresh_ttft_s": fresh_ttft,
        "retry_ttft_s": retry_ttft,
        "fresh_sha": sha(fresh.token_ids),
        "retry_sha": sha(retry.token_ids),
        "outputs_equal": fresh.token_ids == retry.token_ids,
    }
    print(
        f"prompt {len(prompt)} tokens, cancel after {args.after}s, block {engine.config.block_size}"
    )
    for r in rows:
        fired = (
            "it never fired: the request ended first"
            if r["cancel_to_end_s"] is None
            else f"{r['computed_at_cancel']} computed when it fired, ended "
            f"{r['cancel_to_end_s']:.3f} s later"
        )
        print(
            f"  after cancellation {r['cancellation']}: {r['kept_tokens']} tokens kept "
            f"({r['finish']}; {fired})"
        )
    print(
        f"  retry: cached_tokens {retry.cached_tokens}, TTFT {retry_ttft:.3f}s vs fresh {fresh_ttft:.3f}s"
    )
    print(
        f"  token sha256 fresh {result['fresh_sha']} retry {result['retry_sha']} equal={result['outputs_equal']}"
    )
    tag = f"-{args.shape}" if args.shape else ""
    out = RESULTS / f"cancel-receipt{tag}-{args.device}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
