#!/usr/bin/env bash
# H200 call 18 (after the review's mends: one readiness check, the last results kept by
# DeviceRounds): the device-rounds GPU tests, then bench.exactness in exact and fast mode.
export PYTHONUNBUFFERED=1
timeout 90 python3 -m pytest -q tests/test_device_rounds.py tests/test_graphs.py 2>&1 | tail -2
timeout 240 python3 -m bench.exactness --modes exact,fast --requests 8 --max-prompt 1024 \
  --out $OUT/exactness-exact-fast-8-final.json 2>&1 | tail -8
