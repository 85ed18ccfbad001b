"""The server's Prometheus series: lanes' own (`lanes_*`) and the names vLLM exports
(`vllm:*`, labelled `model_name`), so a dashboard built for vLLM shows a lanes server as it is.

Per request (observed when a choice ends): end-to-end latency, queue time (arrival to its first
lane), prefill time (first lane to first token), decode time (first to last token), time to
first token, time per output token, prompt and generation lengths. From the engine's last
published report (read when /metrics is scraped): running and waiting requests, KV usage,
preemptions, prefix-cache queried and hit tokens, speculative drafts, draft tokens and accepted
tokens, and vLLM's accepted tokens per draft position (with lanes' own acceptance rate per
position); for hybrid models, the recurrent-state slots and snapshots (`lanes_state_*`).
"""

from __future__ import annotations

from collections import deque

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from lanes.metrics import ROUND_TOKEN_BUCKETS

RECENT_LATENCIES = 200  # finished requests whose latencies the console can chart
_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_REQUEST_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320)
_LENGTH_BUCKETS = (1, 8, 32, 128, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)


# hybrid models' recurrent state beside the KV (the engine report's keys)
_STATE_SERIES = {
    "state_slots_capacity": "Recurrent-state slots (one per lane that can run)",
    "state_slots_used": "Recurrent-state slots held by lanes",
    "state_bytes": "Bytes of the recurrent-state slots",
    "state_snapshots": "Recurrent-state snapshots kept for cached prefixes",
    "state_snapshot_bytes": "Bytes of those snapshots",
}


def finish_reason(completion) -> str:
    """OpenAI's name for how a choice ended: a cancelled one was aborted."""
    return "abort" if completion.finish_reason == "cancelled" else completion.finish_reason


class _EngineReport:
    """Series read from the engine thread's latest report, built at each scrape."""

    def __init__(self, model_name: str, cache_info: dict | None = None) -> None:
        self.model_name = model_name
        self.cache_info = cache_info or {}
        self.report: dict = {}

    def collect(self):
        r, labels = self.report, [self.model_name]

        def gauge(name: str, doc: str, value: float):
            g = GaugeMetricFamily(name, doc, labels=["model_name"])
            g.add_metric(labels, value)
            return g

        def counter(name: str, doc: str, value: float):
            c = CounterMetricFamily(name, doc, labels=["model_name"])
            c.add_metric(labels, value)
            return c

        total = r.get("blocks_total") or 1
        used = total - r.get("blocks_free", total)
        yield gauge("vllm:num_requests_running", "Requests in a lane", r.get("active_lanes", 0))
        yield gauge("vllm:num_requests_waiting", "Requests queued", r.get("waiting_lanes", 0))
        yield gauge("vllm:kv_cache_usage_perc", "KV blocks in use (0-1)", used / total)
        yield counter("vllm:num_preemptions", "Preemptions", r.get("preemptions", 0))
        yield counter(
            "vllm:prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache",
            r.get("prefix_cache_queried_tokens", 0),
        )
        yield counter(
            "vllm:prefix_cache_hits",
            "Prompt tokens found in the prefix cache",
            r.get("prefix_cache_hit_tokens", 0),
        )
        yield counter("vllm:spec_decode_num_drafts", "Verify steps", r.get("verify_steps", 0))
        yield counter(
            "vllm:spec_decode_num_draft_tokens", "Draft tokens verified", r.get("draft_tokens", 0)
        )
        yield counter(
            "vllm:spec_decode_num_accepted_tokens",
            "Draft tokens kept",
            r.get("accepted_draft_tokens", 0),
        )
        per_pos = CounterMetricFamily(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Draft tokens kept, by position in the draft",
            labels=["model_name", "position"],
        )
        rate = GaugeMetricFamily(
            "lanes_draft_acceptance_rate_per_position",
            "Kept / verified drafts at each draft position (of ended requests)",
            labels=["model_name", "position"],
        )
        drafted, kept = r.get("drafted_at", []), r.get("accepted_at", [])
        for j, n in enumerate(drafted):  # a position is kept only where it was drafted
            k = kept[j] if j < len(kept) else 0
            per_pos.add_metric([self.model_name, str(j)], k)
            rate.add_metric([self.model_name, str(j)], k / n if n else 0.0)
        yield per_pos
        yield rate
        if "round_tokens" in r:  # vLLM's tokens per engine step; lanes': per round
            counts, cumulative, buckets = r["round_tokens"], 0, []
            for bound, n in zip((*ROUND_TOKEN_BUCKETS, float("inf")), counts, strict=True):
                cumulative += n
                buckets.append(("+Inf" if bound == float("inf") else str(float(bound)), cumulative))
            h = HistogramMetricFamily(
                "vllm:iteration_tokens_total", "Tokens per round", labels=["model_name"]
            )
            h.add_metric(labels, buckets, r["round_tokens_sum"])
            yield h
        if self.cache_info:
            info = GaugeMetricFamily(
                "vllm:cache_config_info", "The KV cache's configuration",
                labels=sorted(self.cache_info),
            )  # fmt: skip
            info.add_metric([str(self.cache_info[k]) for k in sorted(self.cache_info)], 1.0)
            yield info
        for key, doc in _STATE_SERIES.items():  # hybrid models only
            if key in r:
                g = GaugeMetricFamily(f"lanes_{key}", doc)
                g.add_metric([], r[key])
                yield g


class ServerMetrics:
    """Prometheus series, in a registry of the app's own."""

    def __init__(self, model_name: str = "lanes", cache_info: dict | None = None) -> None:
        r = self.registry = CollectorRegistry()
        # the process series vLLM's registry carries: CPU, memory, open files, GC, Python
        ProcessCollector(registry=r)
        r.register(PLATFORM_COLLECTOR)
        r.register(GC_COLLECTOR)
        self.requests = Counter(
            "lanes_requests", "Finished requests", ["finish_reason"], registry=r
        )
        self.prompt_tokens = Counter(
            "lanes_prompt_tokens", "Prompt tokens of finished requests", registry=r
        )
        self.cached_tokens = Counter(
            "lanes_cached_prompt_tokens", "Prompt tokens served from the prompt cache", registry=r
        )
        self.generated = Counter("lanes_generation_tokens", "Generated tokens", registry=r)
        self.ttft = Histogram(
            "lanes_time_to_first_token_seconds", "TTFT", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.itl = Histogram(
            "lanes_inter_token_latency_seconds",
            "Inter-token latency",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        # the latest finished requests' latencies, oldest first (the console's chart)
        self.recent_latencies: deque[dict] = deque(maxlen=RECENT_LATENCIES)
        self.num_observed = 0
        self.gauges = {
            name: Gauge(f"lanes_{name}", doc, registry=r)
            for name, doc in {
                "draft_acceptance_rate": "Kept draft tokens / verified draft tokens",
                "prefill_share": "Achieved share of wall time for prompt work (recent mixed rounds)",
                "prompt_cache_bytes": "Bytes of KV held by the prompt cache",
                "prompt_cache_blocks": "Blocks held by the prompt cache",
                "active_lanes": "Lanes in FILL or DECODE",
                "waiting_lanes": "Requests queued for a lane",
                "kv_blocks_used": "KV blocks in use (lanes and prompt cache)",
                "kv_blocks_capacity": "KV blocks in the pool",
                "kv_integrity_ok": "1 if the block bookkeeping checks out",
                "peak_memory_bytes": "Peak GPU memory allocated (CUDA), else peak resident set",
                "engine_alive": "1 while the engine thread runs rounds",
            }.items()
        }
        self.model_name = model_name
        self._vllm_histograms(r)
        self.engine_report = _EngineReport(model_name, cache_info)
        r.register(self.engine_report)

    def _vllm_histograms(self, r: CollectorRegistry) -> None:
        def hist(name: str, doc: str, buckets) -> Histogram:
            return Histogram(name, doc, ["model_name"], buckets=buckets, registry=r)

        self.vllm = {
            "e2e": hist("vllm:e2e_request_latency_seconds", "Arrival to end", _REQUEST_BUCKETS),
            "queue": hist("vllm:request_queue_time_seconds", "Arrival to a lane", _REQUEST_BUCKETS),
            "prefill": hist(
                "vllm:request_prefill_time_seconds", "A lane to the first token", _REQUEST_BUCKETS
            ),
            "decode": hist(
                "vllm:request_decode_time_seconds", "First to last token", _REQUEST_BUCKETS
            ),
            "ttft": hist("vllm:time_to_first_token_seconds", "TTFT", _LATENCY_BUCKETS),
            # between two tokens of a request (vLLM's V1 name; the older one kept beside it)
            "itl": hist("vllm:inter_token_latency_seconds", "Between tokens", _LATENCY_BUCKETS),
            "tpot": hist("vllm:time_per_output_token_seconds", "Between tokens", _LATENCY_BUCKETS),
            "request_tpot": hist(
                "vllm:request_time_per_output_token_seconds",
                "A request's decode time per token after the first",
                _LATENCY_BUCKETS,
            ),
            "max_tokens_asked": hist(
                "vllm:request_max_num_generation_tokens",
                "The most tokens a request could generate (its max_tokens)",
                _LENGTH_BUCKETS,
            ),
            "params_max_tokens": hist(
                "vllm:request_params_max_tokens", "max_tokens of requests", _LENGTH_BUCKETS
            ),
            "params_n": hist("vllm:request_params_n", "n of requests", (1, 2, 4, 8, 16, 32, 64)),
            "prompt_len": hist("vllm:request_prompt_tokens", "Prompt tokens", _LENGTH_BUCKETS),
            "output_len": hist(
                "vllm:request_generation_tokens", "Generated tokens", _LENGTH_BUCKETS
            ),
        }
        self.vllm_success = Counter(
            "vllm:request_success",
            "Finished requests",
            ["model_name", "finished_reason"],
            registry=r,
        )
        self.vllm_prompt_tokens = Counter(
            "vllm:prompt_tokens", "Prompt tokens", ["model_name"], registry=r
        )
        self.vllm_generation_tokens = Counter(
            "vllm:generation_tokens", "Generated tokens", ["model_name"], registry=r
        )

    def observe(self, prompt_len: int, completion) -> None:
        self.requests.labels(finish_reason(completion)).inc()
        self.prompt_tokens.inc(prompt_len)
        self.cached_tokens.inc(completion.cached_tokens)
        self.generated.inc(len(completion.token_ids))
        if completion.ttft is not None:
            self.ttft.observe(completion.ttft)
        times = completion.token_times
        itl = [b - a for a, b in zip(times, times[1:], strict=False)]
        for gap in itl:
            self.itl.observe(gap)
        self._observe_vllm(prompt_len, completion)
        self.num_observed += 1
        self.recent_latencies.append({
            "request": self.num_observed,
            "ttft": completion.ttft,
            "mean_itl": sum(itl) / len(itl) if itl else None,
            "max_itl": max(itl) if itl else None,
            "tokens": len(completion.token_ids),
        })  # fmt: skip

    def _observe_vllm(self, prompt_len: int, c) -> None:
        m, v = self.model_name, self.vllm
        times, scheduled = c.token_times, c.first_scheduled_time
        self.vllm_success.labels(m, finish_reason(c)).inc()
        self.vllm_prompt_tokens.labels(m).inc(prompt_len)
        self.vllm_generation_tokens.labels(m).inc(len(c.token_ids))
        v["prompt_len"].labels(m).observe(prompt_len)
        v["output_len"].labels(m).observe(len(c.token_ids))
        if scheduled is not None:
            v["queue"].labels(m).observe(scheduled - c.arrival_time)
        if not times:
            return
        v["e2e"].labels(m).observe(times[-1] - c.arrival_time)
        v["ttft"].labels(m).observe(times[0] - c.arrival_time)
        v["decode"].labels(m).observe(times[-1] - times[0])
        if scheduled is not None:
            v["prefill"].labels(m).observe(times[0] - scheduled)
        for a, b in zip(times, times[1:], strict=False):
            v["tpot"].labels(m).observe(b - a)
            v["itl"].labels(m).observe(b - a)
        if len(times) > 1:
            v["request_tpot"].labels(m).observe((times[-1] - times[0]) / (len(times) - 1))

    def observe_request(self, n: int, max_tokens: int) -> None:
        """A request as it was asked (once per request, not per choice)."""
        m, v = self.model_name, self.vllm
        v["params_n"].labels(m).observe(n)
        v["params_max_tokens"].labels(m).observe(max_tokens)
        v["max_tokens_asked"].labels(m).observe(max_tokens)
