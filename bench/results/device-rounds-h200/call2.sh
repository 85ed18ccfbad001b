#!/usr/bin/env bash
# H200 call 2: the GGUF's first part to /root/keep (for call 3), the gguf wheel; the EAGLE graph
# tests again (host-managed rounds now asked for), bench_device_rounds at acceptance 0.5.
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /root/keep/cache && cp .gg1/part-aa /root/keep/ || exit 1
timeout 120 python3 -m pytest -q tests/test_graphs.py -k eagle 2>&1 | tail -3
timeout 200 python3 -m bench.bench_device_rounds --acceptance 0.5 --lanes 1,4 --repeats 3 --new 256 \
  --out $OUT/device-rounds-0.5.json 2>&1 | grep -E '"lanes"|decode_tok_s_per_lane|speedup|equal' 
