#!/usr/bin/env bash
# H200 call 1 (seeded rows on the device): GPU tests of the sampling kernels and overlap, the
# kernel against the host path (bench_sampling --part kernel), and decode with seeded requests
# before (.before = 3ced25b) and after, in the same call.
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
timeout 240 python3 -m pytest -q -x -p no:cacheprovider tests/test_kernels.py tests/test_overlap.py \
  > $OUT/gpu-tests.log 2>&1; tail -4 $OUT/gpu-tests.log
timeout 120 python3 -m bench.bench_sampling --part kernel --out $OUT/kernel.json
(cd .before && timeout 120 python3 -m bench.bench_sampling --part engine --out $OUT/engine-before.json)
timeout 120 python3 -m bench.bench_sampling --part engine --out $OUT/engine-after.json
