#!/usr/bin/env bash
# H200 call 3 (K-segment length a runtime value: call 2 found one-block segments folded into the
# accumulator by Triton, rows differing for K = 576): kernel check, GPU tests, bench_matmul (per
# shape: the plan, other splits, the glu input, cuBLAS), profile_busy after.
export PYTHONUNBUFFERED=1
timeout 150 python3 -m bench.kernel_check > /tmp/kc.log 2>&1; tail -3 /tmp/kc.log
cp bench/results/kernels-gpu.json $OUT/kernels-gpu.json
python3 - <<'PY'
import json
d = json.load(open("bench/results/kernels-gpu.json"))
print({k: v["result"] for k, v in d["kernels"].items()})
for k, v in d["matmul_invariance_8b_layers"].items():
    print(k, v)
PY
timeout 200 python3 -m pytest -q tests/test_kernels.py tests/test_graphs.py tests/test_device_rounds.py 2>&1 | tail -4
timeout 150 python3 -m bench.bench_matmul --out $OUT/matmul.json 2>&1 | tail -40
timeout 100 python3 -m bench.profile_busy --overlap on --out $OUT/busy-after.json 2>&1 | grep lanes=
