#!/usr/bin/env bash
# H200 call 6 (final tree): the kernel's set passes as one helper (same arithmetic), GPU tests of
# the sampling kernels and seeded device rounds, kernel bench, bench.exactness.
export PYTHONUNBUFFERED=1
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_graphs.py \
  tests/test_device_rounds.py -k "sampl or seeded or greedy or captured or undrafted" > $OUT/gpu-tests.log 2>&1
tail -2 $OUT/gpu-tests.log
timeout 80 python3 -m bench.bench_sampling --part kernel --out $OUT/kernel.json | grep "R1 \|R64 T0.7 top_p"
timeout 170 python3 -m bench.exactness --modes exact,fast --requests 8 --max-prompt 1024 \
  --out $OUT/exactness.json > $OUT/exactness.log 2>&1; tail -4 $OUT/exactness.log
