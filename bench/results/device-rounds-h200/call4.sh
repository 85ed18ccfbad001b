#!/usr/bin/env bash
# H200 call 4: where a device round's wall time goes at batch 1 (acceptance 0.8): kernel gaps
# split by length, kernels per round, cProfile of 40 rounds; then the GGUF's first part for
# call 5 (real weights, k sweep).
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /root/keep/cache && cp .gg1/part-aa /root/keep/ || exit 1
timeout 240 python3 -m bench.bench_device_rounds --acceptance 0.8 --lanes 1 --repeats 2 --new 256 \
  --cprofile 40 --out $OUT/device-rounds-0.8-gaps.json > /tmp/dr.log 2>&1
grep -E '"lanes"|decode_tok_s_per_lane|speedup|_ms_per_step|kernels_per_step' /tmp/dr.log
grep -A60 "Ordered by: internal" /tmp/dr.log | head -40
grep -A50 "Ordered by: cumulative" /tmp/dr.log | head -50
