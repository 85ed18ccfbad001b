#!/usr/bin/env bash
# H200 call 2: GPU kernel tests (the attention tile split now masks raw scores and scales by an
# explicit fma), prefill GEMM through tensor descriptors in several layouts, attention layouts
# (rows per program, stages, 64- or 128-key tiles) against SDPA.
export PYTHONUNBUFFERED=1
timeout 150 python3 -m pytest -q tests/test_kernels.py 2>&1 | tail -3
timeout 200 python3 -m bench.bench_prefill_tiles --out $OUT/prefill-tiles.json 2>&1 | tail -5
timeout 150 python3 -m bench.bench_attention --out $OUT/attention.json 2>&1 | tail -3
