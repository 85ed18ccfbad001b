#!/usr/bin/env bash
# H200 call 7: GPU tests (kernels, graphs, device rounds, hybrid/MoE, penalties) on the final
# decode kernels, then bench_prefill_tiles (larger tiles for the one-program path at M = 8192).
export PYTHONUNBUFFERED=1
timeout 240 python3 -m pytest -q tests/test_kernels.py tests/test_graphs.py tests/test_device_rounds.py \
  tests/test_hybrid.py tests/test_moe.py tests/test_penalties.py 2>&1 | tail -4
timeout 200 python3 -m bench.bench_prefill_tiles --out $OUT/prefill-tiles.json 2>&1 | tail -8
