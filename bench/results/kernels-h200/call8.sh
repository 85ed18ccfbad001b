#!/usr/bin/env bash
# H200 call 8 (prefill: 128 x 128 tiles, 8 warps, 4 stages for M > 64, from call 7): kernel check
# (rows of M = 1, 37, 64, 128 against M = 4096), bench_engine c64, bench.exactness.
export PYTHONUNBUFFERED=1
timeout 100 python3 -m bench.kernel_check > /tmp/kc.log 2>&1; tail -3 /tmp/kc.log
cp bench/results/kernels-gpu.json $OUT/kernels-gpu.json
python3 - <<'PY'
import json
d = json.load(open("bench/results/kernels-gpu.json"))
print({k: v["result"] for k, v in d["kernels"].items()})
print({k: v["triton_rows_equal"] for k, v in d["matmul_invariance_8b_layers"].items()})
PY
timeout 100 python3 -m bench.bench_engine --sections c64 --out $OUT/engine-c64.json 2>&1 | grep "^c64"
timeout 150 python3 -m bench.exactness --modes exact,fast --requests 8 --max-prompt 1024 \
  --out $OUT/exactness-exact-fast-8.json 2>&1 | tail -4
