#!/usr/bin/env bash
# H200 call 1: GPU tests of the device rounds (graphed and eager) and the graph tests; then
# bench_device_rounds (SmolLM2 shape, random bf16 weights, shipped head for its cost,
# acceptance 0.8, k = 4, lanes 1 and 4, 256 new tokens, medians of 3).
export PYTHONUNBUFFERED=1
timeout 300 python3 -m pytest -q tests/test_device_rounds.py tests/test_graphs.py 2>&1 | tail -25
timeout 270 python3 -m bench.bench_device_rounds --lanes 1,4 --repeats 3 --new 256 \
  --out $OUT/device-rounds-0.8.json 2>&1 | tail -80
