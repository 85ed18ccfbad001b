"""/metrics latency while a server holds 64 running lanes (issue 20 item 5): 64 concurrent
streamed chat requests against a running `lanes serve --max-num-seqs 64`, /metrics polled every
0.25 s meanwhile; latencies overall and at the polls that saw 64 running.

    python bench/serving/metrics_load.py [PORT]      # results/metrics-64-lanes-cpu.json has a run
"""

import json
import re
import statistics
import sys
import threading
import time
import urllib.request

url = f"http://127.0.0.1:{sys.argv[1] if len(sys.argv) > 1 else 8123}"
model = json.loads(urllib.request.urlopen(url + "/v1/models").read())["data"][0]["id"]


def request(i: int) -> None:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": f"Tell me fact number {i} about the sea."}],
        "max_tokens": 48,
        "temperature": 0,
        "stream": True,
    }
    headers = {"content-type": "application/json"}
    post = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(), headers)
    for _ in urllib.request.urlopen(post, timeout=900):
        pass


threads = [threading.Thread(target=request, args=(i,)) for i in range(64)]
for t in threads:
    t.start()
seconds, running = [], []
while any(t.is_alive() for t in threads):
    start = time.perf_counter()
    text = urllib.request.urlopen(url + "/metrics", timeout=60).read().decode()
    seconds.append(time.perf_counter() - start)
    found = re.search(r"^vllm:num_requests_running\{[^}]*\} ([0-9.]+)", text, re.M)
    running.append(float(found.group(1)) if found else -1.0)
    time.sleep(0.25)
at_64 = [s for s, r in zip(seconds, running, strict=True) if r >= 64]
print(
    json.dumps(
        {
            "polls": len(seconds),
            "median_ms": 1000 * statistics.median(seconds),
            "max_ms": 1000 * max(seconds),
            "polls_at_64_running": len(at_64),
            "median_ms_at_64": 1000 * statistics.median(at_64) if at_64 else None,
            "max_ms_at_64": 1000 * max(at_64) if at_64 else None,
            "max_running": max(running),
        },
        indent=1,
    )
)
