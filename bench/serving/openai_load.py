"""Drive any OpenAI-compatible server (lanes or another engine) with the official async client.

    python -m bench.serving.openai_load --base-url http://127.0.0.1:8000/v1 --model NAME
        [--sections ttft,decode,draft,exact,cancel] [--tiny] [--out bench/results/openai.json]

- ttft:   prompt ladder (2K, 8K, 32K, 64K ... up to the server's max_model_len): time to first token;
- decode: concurrency 1, 4, 16, 64: output tok/s and inter-token latency percentiles;
- draft:  "draft": true vs false, alternating A B A B with repeats: medians and equality;
- exact:  per request the SHA-256 of the output text for drafted vs undrafted, resumed vs
          fresh and concurrent vs solo, and the counts of matches;
- cancel: cancel a long prompt after t seconds, once and twice; retained cached_tokens, retry
          TTFT against a fresh run, output equality.
Prompts are token-id lists (the completions endpoint takes them), each led by a distinct token
so no two requests share a prefix unless a section means them to. Writes JSON and a markdown
table; `python -m bench.plots` draws the PNGs.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import statistics
import time
from pathlib import Path

import openai
from huggingface_hub.utils import tqdm

from bench import RESULTS


def make_prompt(n: int, lead: int, vocab: int) -> list[int]:
    """n token ids below vocab; the first one (from `lead`) keeps prompts apart."""
    span = vocab - 3
    return [3 + lead % span] + [3 + (i * 7919) % span for i in range(n - 1)]


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class Bench:
    def __init__(self, base_url: str, model: str, api_key: str, vocab: int) -> None:
        self.client = openai.AsyncOpenAI(
            base_url=base_url, api_key=api_key, max_retries=0, timeout=600
        )
        self.model = model
        self.vocab = vocab

    def prompt(self, n: int, lead: int) -> list[int]:
        return make_prompt(n, lead, self.vocab)

    async def stream(
        self,
        prompt,
        max_tokens: int,
        extra: dict | None = None,
        cancel_after: float | None = None,
        seed: int | None = None,
    ):
        """One streamed completion: (text, ttft, chunk times, usage or None, finished)."""
        body = {"ignore_eos": True, **(extra or {})}
        start = time.perf_counter()
        s = await self.client.completions.create(
            model=self.model,
            prompt=prompt,
            max_tokens=max_tokens,
            temperature=0.7 if seed is not None else 0,
            seed=seed,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=body,
        )
        text, times, usage, finished = "", [], None, False
        try:
            async for chunk in s:
                now = time.perf_counter()
                if chunk.usage is not None:
                    usage = chunk.usage
                for c in chunk.choices:
                    if c.text:
                        text += c.text
                        times.append(now)
                    finished = finished or c.finish_reason is not None
                if cancel_after is not None and now - start > cancel_after:
                    break
        finally:
            await s.close()
        ttft = times[0] - start if times else None
        return text, ttft, times, usage, finished

    async def ttft_ladder(self, lengths, repeats: int) -> list[dict]:
        rows = []
        for n in tqdm(lengths, desc="ttft ladder"):
            ttfts = [(await self.stream(self.prompt(n, 100 * n + r), 1))[1] for r in range(repeats)]
            rows.append(
                {"prompt_tokens": n, "ttft_median_s": statistics.median(ttfts), "runs": ttfts}
            )
        return rows

    async def decode_ladder(self, levels, prompt_len: int, new: int) -> list[dict]:
        rows = []
        for c in tqdm(levels, desc="decode ladder"):
            start = time.perf_counter()
            results = await asyncio.gather(
                *(self.stream(self.prompt(prompt_len, 7000 + c * 100 + i), new) for i in range(c))
            )
            wall = time.perf_counter() - start
            gaps = sorted(
                b - a for _, _, t, _, _ in results for a, b in zip(t, t[1:], strict=False)
            )
            tokens = sum(u.completion_tokens for *_, u, _ in results if u is not None)
            rows.append(
                {
                    "concurrency": c,
                    "output_tok_s": tokens / wall,
                    "itl_p50_s": gaps[len(gaps) // 2] if gaps else None,
                    "itl_p90_s": gaps[int(len(gaps) * 0.9)] if gaps else None,
                    "itl_p99_s": gaps[int(len(gaps) * 0.99)] if gaps else None,
                }
            )
        return rows

    async def draft_ab(self, prompt_len: int, new: int, repeats: int) -> dict:
        times = {True: [], False: []}
        texts = {True: set(), False: set()}
        p = self.prompt(prompt_len, 9001)
        for r in tqdm(range(repeats), desc="draft A/B"):
            for draft in (True, False):  # A B A B
                start = time.perf_counter()
                text, *_ = await self.stream(
                    p, new, {"draft": draft, "cache_salt": f"ab{r}{draft}"}, seed=5
                )
                times[draft].append(time.perf_counter() - start)
                texts[draft].add(sha(text))
        return {
            "median_s_drafted": statistics.median(times[True]),
            "median_s_undrafted": statistics.median(times[False]),
            "speedup": statistics.median(times[False]) / statistics.median(times[True]),
            "outputs_equal": texts[True] == texts[False] and len(texts[True]) == 1,
        }

    async def exact_receipt(self, count: int, prompt_len: int, new: int) -> dict:
        prompts = [self.prompt(prompt_len + 7 * i, 11000 + i) for i in range(count)]
        solo = [
            (await self.stream(p, new, {"cache_salt": "solo", "draft": False}, seed=i))[0]
            for i, p in enumerate(prompts)
        ]
        drafted = [
            (await self.stream(p, new, {"cache_salt": "drafted"}, seed=i))[0]
            for i, p in enumerate(prompts)
        ]
        together = await asyncio.gather(
            *(
                self.stream(p, new, {"cache_salt": "together"}, seed=i)
                for i, p in enumerate(prompts)
            )
        )
        resumed = []
        for i, p in enumerate(prompts):
            await self.stream(p, new, {"cache_salt": "resume"}, seed=i, cancel_after=0.0)
            resumed.append((await self.stream(p, new, {"cache_salt": "resume"}, seed=i))[0])
        rows = [
            {"solo": sha(s), "drafted": sha(d), "concurrent": sha(c[0]), "resumed": sha(r)}
            for s, d, c, r in zip(solo, drafted, together, resumed, strict=True)
        ]
        return {
            "requests": rows,
            "drafted_equals_undrafted": sum(r["drafted"] == r["solo"] for r in rows),
            "concurrent_equals_solo": sum(r["concurrent"] == r["solo"] for r in rows),
            "resumed_equals_fresh": sum(r["resumed"] == r["solo"] for r in rows),
            "of": len(rows),
        }

    async def cancel_receipt(self, prompt_len: int, after: float, new: int) -> dict:
        """Cancel once (then retry), and separately cancel twice (then retry), each under its own
        cache salt; compare each retry with a fresh run under a third salt."""
        p = self.prompt(prompt_len, 12345)
        fresh_text, fresh_ttft, *_ = await self.stream(p, new, {"cache_salt": "cancel-fresh"})
        rows = []
        for times in (1, 2):
            salt = f"cancel-{times}x"
            for _ in range(times):
                await self.stream(p, new, {"cache_salt": salt}, cancel_after=after)
                await asyncio.sleep(0.2)  # the server sees the disconnect between two forwards
            text, ttft, _, usage, _ = await self.stream(p, new, {"cache_salt": salt})
            rows.append(
                {
                    "cancellations": times,
                    "retry_cached_tokens": usage.prompt_tokens_details.cached_tokens
                    if usage and usage.prompt_tokens_details
                    else None,
                    "retry_ttft_s": ttft,
                    "outputs_equal": sha(text) == sha(fresh_text),
                }
            )
        return {
            "prompt_tokens": prompt_len,
            "cancel_after_s": after,
            "fresh_ttft_s": fresh_ttft,
            "retries": rows,
        }


def markdown(report: dict) -> str:
    lines = [f"# bench_openai: {report['model']} at {report['base_url']}", ""]
    if "ttft" in report:
        lines += (
            ["| prompt tokens | TTFT median s |", "| --- | --- |"]
            + [f"| {r['prompt_tokens']} | {r['ttft_median_s']:.3f} |" for r in report["ttft"]]
            + [""]
        )
    if "decode" in report:
        lines += [
            "| concurrency | output tok/s | ITL p50 ms | ITL p90 ms |",
            "| --- | --- | --- | --- |",
        ]
        lines += [
            f"| {r['concurrency']} | {r['output_tok_s']:.1f} | {1e3 * (r['itl_p50_s'] or 0):.1f} | {1e3 * (r['itl_p90_s'] or 0):.1f} |"
            for r in report["decode"]
        ] + [""]
    for key in ("draft", "cancel"):  # short sections: one line each
        if key in report:
            lines += [f"{key}: " + ", ".join(f"{k}={v}" for k, v in report[key].items()), ""]
    if "exact" in report:
        e = report["exact"]
        lines += [
            f"exactness: drafted==undrafted {e['drafted_equals_undrafted']}/{e['of']}, concurrent==solo {e['concurrent_equals_solo']}/{e['of']}, resumed==fresh {e['resumed_equals_fresh']}/{e['of']}",
            "",
        ]
    if report.get("server_peak_memory_bytes") is not None:
        lines += [f"server peak memory: {report['server_peak_memory_bytes'] / 2**30:.2f} GiB", ""]
    return "\n".join(lines)


async def run(args) -> dict:
    b = Bench(args.base_url, args.model, args.api_key, args.vocab)
    report = {"base_url": args.base_url, "model": args.model, "tiny": args.tiny}
    out = Path(args.out)

    def save() -> None:  # after every section, so a time limit keeps what was measured
        out.write_text(json.dumps(report, indent=2) + "\n")

    sections = args.sections.split(",")
    models = await b.client.models.list()
    max_len = getattr(models.data[0], "max_model_len", None) or 8192
    if "ttft" in sections:
        ladder = (
            [64, 128]
            if args.tiny
            else [
                n
                for n in (2048, 8192, 32768, 65536, 131072)
                if n < max_len and n <= args.max_prompt
            ]
        )
        report["ttft"] = await b.ttft_ladder(ladder, 1 if args.tiny else 3)
        save()
    if "decode" in sections:
        report["decode"] = await b.decode_ladder(
            [1, 4] if args.tiny else [1, 4, 16, 64],
            32 if args.tiny else 512,
            8 if args.tiny else 256,
        )
        save()
    if "draft" in sections:
        report["draft"] = await b.draft_ab(
            32 if args.tiny else 256, 8 if args.tiny else 128, 2 if args.tiny else 5
        )
        save()
    if "exact" in sections:
        report["exact"] = await b.exact_receipt(
            3 if args.tiny else 16, 24 if args.tiny else 512, 8 if args.tiny else 64
        )
        save()
    if "cancel" in sections:
        report["cancel"] = await b.cancel_receipt(
            min(max_len - 64, 3000 if args.tiny else 32768), args.cancel_after, 8
        )
        save()
    report["server_peak_memory_bytes"] = await asyncio.to_thread(server_peak_memory, args.base_url)
    save()
    await b.client.close()
    return report


def server_peak_memory(base_url: str) -> float | None:
    """The server's peak memory from its Prometheus /metrics (lanes: `lanes_peak_memory_bytes`,
    GPU bytes on CUDA); None where the server does not publish it."""
    import urllib.request

    root = base_url.rstrip("/").removesuffix("/v1")
    try:
        with urllib.request.urlopen(root + "/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("lanes_peak_memory_bytes "):
            return float(line.split()[1])
    return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    ap.add_argument("--model", required=True)
    ap.add_argument("--api-key", default="none")
    ap.add_argument("--vocab", type=int, default=32000, help="prompt token ids stay below this")
    ap.add_argument("--sections", default="ttft,decode,draft,exact,cancel")
    ap.add_argument("--cancel-after", type=float, default=1.0)
    ap.add_argument(
        "--max-prompt", type=int, default=2**30, help="longest prompt of the TTFT ladder"
    )
    ap.add_argument("--tiny", action="store_true", help="small settings (CPU, tests)")
    ap.add_argument("--out", default=str(RESULTS / "openai.json"))
    args = ap.parse_args()
    report = asyncio.run(run(args))
    out = Path(args.out)
    out.write_text(json.dumps(report, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(report) + "\n")
    print(markdown(report))


if __name__ == "__main__":
    main()
