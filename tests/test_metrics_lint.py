"""/metrics as vLLM users scrape it: the series issue 43 found missing are there, and every name
passes Prometheus' lint rules as promtool applies them (help text; a gauge never named like a
counter's `_total`)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from lanes import build_engine
from tests.live_server import LiveServer

# vLLM exports a histogram under this name; kept for its dashboards
VLLM_NAMES = {"vllm:iteration_tokens_total"}
WANTED = ["vllm:inter_token_latency_seconds", "vllm:request_time_per_output_token_seconds",
          "vllm:request_max_num_generation_tokens", "vllm:request_params_n",
          "vllm:request_params_max_tokens", "vllm:iteration_tokens_total",
          "vllm:cache_config_info", "process_resident_memory_bytes", "lanes_kv_blocks_capacity"]  # fmt: skip


def lint(text: str) -> list[str]:
    problems = []
    for family in text_string_to_metric_families(text):
        if not family.documentation:
            problems.append(f"{family.name}: no help text")
        counter_like = family.type != "counter" and family.name.endswith("_total")
        if counter_like and family.name not in VLLM_NAMES:
            problems.append(f"{family.name}: a {family.type} named like a counter")
    return problems


def test_the_series_vllm_dashboards_read_and_a_clean_lint(llama_dir):
    engine = build_engine(str(llama_dir))
    with LiveServer(engine) as live:
        c = live.client()
        c.completions.create(model="tiny", prompt="hi there", max_tokens=4, n=2, seed=1)
        text = live.get("/metrics")
    names = {f.name for f in text_string_to_metric_families(text)}
    assert not [w for w in WANTED if w not in names]
    assert lint(text) == []
    assert 'vllm:request_params_n_bucket{le="2.0",model_name="tiny"} 1.0' in text
    assert 'vllm:request_params_max_tokens_sum{model_name="tiny"} 4.0' in text
    block = f'block_size="{engine.config.block_size}"'
    assert any(line.startswith("vllm:cache_config_info{") and block in line
               for line in text.splitlines())  # fmt: skip


def test_negative_control_a_gauge_named_total_fails_the_lint():
    text = (
        "# HELP lanes_blocks_total Blocks\n# TYPE lanes_blocks_total gauge\nlanes_blocks_total 3\n"
    )
    assert lint(text) == ["lanes_blocks_total: a gauge named like a counter"]


# Every series the panels of vLLM's example Grafana dashboard query
# (docs.vllm.ai examples/observability/prometheus_grafana/grafana.json, as of 2026-09)
VLLM_DASHBOARD = [
    "vllm:e2e_request_latency_seconds_bucket", "vllm:e2e_request_latency_seconds_sum",
    "vllm:e2e_request_latency_seconds_count", "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total", "vllm:inter_token_latency_seconds_bucket",
    "vllm:inter_token_latency_seconds_sum", "vllm:inter_token_latency_seconds_count",
    "vllm:request_time_per_output_token_seconds_bucket",
    "vllm:request_time_per_output_token_seconds_sum",
    "vllm:request_time_per_output_token_seconds_count", "vllm:num_requests_running",
    "vllm:num_requests_waiting", "vllm:time_to_first_token_seconds_bucket",
    "vllm:time_to_first_token_seconds_sum", "vllm:time_to_first_token_seconds_count",
    "vllm:kv_cache_usage_perc", "vllm:request_prompt_tokens_bucket",
    "vllm:request_generation_tokens_bucket", "vllm:request_success_total",
    "vllm:request_queue_time_seconds_sum", "vllm:request_prefill_time_seconds_sum",
    "vllm:request_decode_time_seconds_sum", "vllm:request_max_num_generation_tokens_sum",
]  # fmt: skip


def test_every_panel_of_vllms_dashboard_has_its_series(llama_dir):
    engine = build_engine(str(llama_dir))
    with LiveServer(engine) as live:
        live.client().completions.create(model="tiny", prompt="hi", max_tokens=3)
        text = live.get("/metrics")
    samples = {s.name: s.labels for f in text_string_to_metric_families(text) for s in f.samples}
    missing = [name for name in VLLM_DASHBOARD if name not in samples]
    assert not missing, missing
    assert all(samples[name].get("model_name") == "tiny" for name in VLLM_DASHBOARD)
