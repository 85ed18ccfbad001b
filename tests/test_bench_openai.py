"""bench/serving/openai_load.py against a live lanes server at tiny settings: every section runs and
the exactness receipt finds every output equal."""

from __future__ import annotations

import argparse
import asyncio
import json

from bench.serving import openai_load as bench_openai
from lanes import EngineConfig, build_engine
from tests.live_server import MODEL, LiveServer


def test_bench_openai_tiny(long_model_dir, tmp_path):
    engine = build_engine(str(long_model_dir), EngineConfig(drafter="ngram", prefill_chunk=16))
    with LiveServer(engine, report_cached_tokens=True) as live:
        args = argparse.Namespace(
            base_url=live.url + "/v1",
            model=MODEL,
            api_key="none",
            sections="ttft,decode,draft,exact,cancel",
            cancel_after=0.05,
            tiny=True,
            vocab=384,
            max_prompt=2**30,
            out=str(tmp_path / "o.json"),
        )
        report = asyncio.run(bench_openai.run(args))
    json.dumps(report)  # serialisable
    assert [r["prompt_tokens"] for r in report["ttft"]] == [64, 128]
    assert all(r["ttft_median_s"] > 0 for r in report["ttft"])
    assert [r["concurrency"] for r in report["decode"]] == [1, 4] and report["decode"][1][
        "output_tok_s"
    ] > 0
    assert report["draft"]["outputs_equal"]
    e = report["exact"]
    assert (
        e["drafted_equals_undrafted"]
        == e["concurrent_equals_solo"]
        == e["resumed_equals_fresh"]
        == e["of"]
        == 3
    )
    retries = report["cancel"]["retries"]
    assert all(r["outputs_equal"] for r in retries)
    assert retries[1]["retry_cached_tokens"] >= retries[0]["retry_cached_tokens"] > 0
    assert "| concurrency |" in bench_openai.markdown(report)
    assert report["server_peak_memory_bytes"] > 2**20  # the server published its peak memory
