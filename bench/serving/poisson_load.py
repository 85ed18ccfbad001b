"""Serving under a realistic load (issue 42 item 4): requests arriving as a Poisson process at
several rates, up to saturation (every request at once), with chat prompts and drawn output
lengths; greedy and sampled, drafting on and off; through the HTTP server with the OpenAI client,
as users call it, and in-process through the AsyncEngine the server itself drives.

    python -m bench.serving.poisson_load [--model M] [--drafter D] [--rates 0.5,2,inf]
        [--requests 24] [--median-output 96] [--paths http,inprocess] [--out F]

Where the load comes from: the prompts are lanes' everyday chat set (bench/data/
everyday_prompts.json: questions users send, by category), taken in a seeded shuffled order;
each request's output length is drawn from a log-normal distribution (median --median-output,
sigma 0.6, clipped to [16, 4 x median]) and held with ignore_eos, so a run's work does not
depend on the model's EOS. The log-normal is our assumption of a chat-like long tail, not a fit
to a published trace (none is on this machine). Arrival times, prompt order and lengths come
from --seed: every setting gets the same requests.

Per setting: output tok/s (completion tokens over the time from the first arrival to the last
finish), TTFT p50/p99, inter-token latency p50/p99 (the gaps between the chunks a client
receives; a drafted chunk carries several tokens) and time per output token p50 (a request's
(last - first token time) / (tokens - 1)). Each setting salts the prompt cache, so no setting
reads another's prefixes. Writes JSON and a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import socket
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from bench import RESULTS
from bench.stats import percentile
from lanes import EngineConfig, SamplingParams, build_engine

EVERYDAY = Path(__file__).resolve().parents[1] / "data" / "everyday_prompts.json"
SIGMA = 0.6


@dataclass(frozen=True)
class Request:
    arrival: float  # seconds after the setting starts
    messages: list[dict]
    max_tokens: int


@dataclass
class Outcome:
    ttft: float | None
    chunk_times: list[float]  # when each chunk with text or tokens arrived (perf_counter)
    tokens: int
    error: str | None = None


def make_requests(n: int, rate: float, median: int, seed: int) -> list[Request]:
    """n requests: Poisson arrivals at `rate` per second (inf: all at time 0), everyday prompts
    in a shuffled order, log-normal output lengths."""
    rng = random.Random(seed)
    prompts = [p["messages"] for p in json.loads(EVERYDAY.read_text())["prompts"]]
    order = [prompts[i % len(prompts)] for i in range(n)]
    rng.shuffle(order)
    t, out = 0.0, []
    for messages in order:
        length = round(math.exp(rng.gauss(math.log(median), SIGMA)))
        out.append(Request(t, messages, max(16, min(4 * median, length))))
        if math.isfinite(rate):
            t += rng.expovariate(rate)
    return out


def summarise(outcomes: list[Outcome], wall: float) -> dict:
    ok = [o for o in outcomes if o.error is None]
    gaps = [b - a for o in ok for a, b in zip(o.chunk_times, o.chunk_times[1:], strict=False)]
    tpot = [
        (o.chunk_times[-1] - o.chunk_times[0]) / (o.tokens - 1)
        for o in ok
        if o.tokens > 1 and len(o.chunk_times) > 1
    ]
    ttfts = [o.ttft for o in ok if o.ttft is not None]
    return {
        "requests": len(outcomes),
        "failed": len(outcomes) - len(ok),
        "output_tok_s": sum(o.tokens for o in ok) / wall if wall > 0 else None,
        "ttft_p50_s": percentile(ttfts, 0.5),
        "ttft_p99_s": percentile(ttfts, 0.99),
        "itl_p50_s": percentile(gaps, 0.5),
        "itl_p99_s": percentile(gaps, 0.99),
        "tpot_p50_s": statistics.median(tpot) if tpot else None,
        "wall_s": wall,
    }


async def _drive(requests: list[Request], one) -> tuple[list[Outcome], float]:
    """Start each request at its arrival time; (outcomes, wall from the first arrival to the
    last finish)."""
    start = time.perf_counter()

    async def timed(i: int, r: Request) -> Outcome:
        await asyncio.sleep(max(0.0, start + r.arrival - time.perf_counter()))
        try:
            return await one(i, r)
        except Exception as e:  # a failed request is counted, not fatal to the run
            return Outcome(None, [], 0, f"{type(e).__name__}: {e}")

    outcomes = await asyncio.gather(*(timed(i, r) for i, r in enumerate(requests)))
    return list(outcomes), time.perf_counter() - start


def _params(r: Request, sampled: bool, draft: bool, seed: int) -> dict:
    return dict(max_tokens=r.max_tokens, temperature=0.7 if sampled else 0.0,
                seed=seed if sampled else None, draft=draft)  # fmt: skip


async def run_http(url: str, model: str, requests, sampled: bool, draft: bool, salt: str):
    import openai

    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)

    async def one(i: int, r: Request) -> Outcome:
        p = _params(r, sampled, draft, 1000 + i)
        sent = time.perf_counter()
        stream = await client.chat.completions.create(
            model=model, messages=r.messages, max_tokens=p["max_tokens"],
            temperature=p["temperature"], seed=p["seed"], stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True, "draft": draft, "cache_salt": salt},
        )  # fmt: skip
        times, tokens = [], 0
        async for chunk in stream:
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
            if any(c.delta.content for c in chunk.choices):
                times.append(time.perf_counter())
        return Outcome(times[0] - sent if times else None, times, tokens)

    try:
        return await _drive(requests, one)
    finally:
        await client.close()


async def run_inprocess(async_engine, requests, sampled: bool, draft: bool, salt: str):
    from lanes.async_engine import Failed, Finished

    async def one(i: int, r: Request) -> Outcome:
        p = _params(r, sampled, draft, 1000 + i)
        params = SamplingParams(ignore_eos=True, **p)
        sent = time.perf_counter()
        handle = await async_engine.submit(r.messages, params, cache_salt=salt)
        times, tokens = [], 0
        while True:
            event = await handle.next_event()
            if isinstance(event, Finished):
                tokens = len(event.completion.token_ids)
                break
            if isinstance(event, Failed):
                raise event.error
            if getattr(event, "token_ids", None):
                times.append(time.perf_counter())
            elif not hasattr(event, "token_ids"):  # aborted
                raise RuntimeError(f"request ended with {type(event).__name__}")
        return Outcome(times[0] - sent if times else None, times, tokens)

    return await _drive(requests, one)


class _Server:
    """The lanes app under uvicorn on a free loopback port, in a thread of this process."""

    def __init__(self, engine, model: str) -> None:
        import uvicorn

        from lanes.server import build_app

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        app = build_app(engine, model, log_requests=False, log_stats=False)
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    def __enter__(self) -> _Server:
        import urllib.request

        self.thread.start()
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                urllib.request.urlopen(self.url + "/health", timeout=2)
                return self
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("the server did not come up")

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def markdown(report: dict) -> str:
    lines = [
        "| path | sampling | draft | rate (req/s) | output tok/s | TTFT p50 / p99 (s) | "
        "ITL p50 / p99 (ms) | TPOT p50 (ms) | failed |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]

    def ms(x):
        return "-" if x is None else f"{1000 * x:.1f}"

    def s(x):
        return "-" if x is None else f"{x:.3f}"

    for row in report["rows"]:
        lines.append(
            f"| {row['path']} | {row['sampling']} | {'on' if row['draft'] else 'off'} | "
            f"{row['rate']} | {row['output_tok_s']:.1f} | {s(row['ttft_p50_s'])} / "
            f"{s(row['ttft_p99_s'])} | {ms(row['itl_p50_s'])} / {ms(row['itl_p99_s'])} | "
            f"{ms(row['tpot_p50_s'])} | {row['failed']} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="default: lanes' default model")
    ap.add_argument("--drafter", default="none", help="as lanes serve --drafter")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rates", default="0.5,2,inf", help="requests per second; inf: all at once")
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--median-output", type=int, default=96)
    ap.add_argument("--paths", default="http,inprocess")
    ap.add_argument("--sampling", default="greedy,sampled")
    ap.add_argument("--draft", default="on,off")
    ap.add_argument("--max-lanes", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(RESULTS / "poisson-load.json"))
    args = ap.parse_args()
    engine = build_engine(
        args.model, EngineConfig(device=args.device, drafter=args.drafter, max_lanes=args.max_lanes)
    )
    rates = [float(x) for x in args.rates.split(",")]
    report = {"model": args.model or "default", "drafter": args.drafter, "device": args.device,
              "requests": args.requests, "median_output": args.median_output,
              "sigma": SIGMA, "seed": args.seed, "rows": []}  # fmt: skip
    out = Path(args.out)

    def record(path, sampling, draft, rate, outcomes, wall):
        row = {"path": path, "sampling": sampling, "draft": draft, "rate": rate}
        row.update(summarise(outcomes, wall))
        report["rows"].append(row)
        print(json.dumps(row), flush=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1))  # after every row: a time limit keeps it

    settings = [
        (sampling, draft == "on", rate)
        for rate in rates
        for sampling in args.sampling.split(",")
        for draft in args.draft.split(",")
    ]
    paths = args.paths.split(",")
    if "http" in paths:
        with _Server(engine, "lanes") as server:
            for sampling, draft, rate in settings:
                requests = make_requests(args.requests, rate, args.median_output, args.seed)
                salt = f"http-{sampling}-{draft}-{rate}"
                got = asyncio.run(
                    run_http(server.url, "lanes", requests, sampling == "sampled", draft, salt)
                )
                record("http", sampling, draft, rate, *got)
    if "inprocess" in paths:
        from lanes.async_engine import AsyncEngine

        async_engine = AsyncEngine(engine, log_stats=False)
        async_engine.start()
        try:
            for sampling, draft, rate in settings:
                requests = make_requests(args.requests, rate, args.median_output, args.seed)
                salt = f"inprocess-{sampling}-{draft}-{rate}"
                got = asyncio.run(
                    run_inprocess(async_engine, requests, sampling == "sampled", draft, salt)
                )
                record("inprocess", sampling, draft, rate, *got)
        finally:
            async_engine.stop()
    out.with_suffix(".md").write_text(markdown(report) + "\n")
    print(markdown(report))


if __name__ == "__main__":
    main()
