#!/usr/bin/env bash
# H200 call 3: adopted prefill tiles (tensor descriptors; 128 x 256, 256 x 128 for >= 16K columns),
# attention with 128-key tiles (wide rows for >= 512 queries), programmatic dependent launch on
# the forward's kernels. Correctness first: GPU tests, kernel check, exactness (exact and fast).
export PYTHONUNBUFFERED=1
python3 -c "import triton, torch; print('triton', triton.__version__, 'torch', torch.__version__)"
timeout 240 python3 -m pytest -q -x tests/test_kernels.py tests/test_graphs.py tests/test_device_rounds.py 2>&1 | tail -3
timeout 100 python3 -m bench.kernel_check > /tmp/kc.log 2>&1; tail -3 /tmp/kc.log
cp bench/results/kernels-gpu.json $OUT/kernels-gpu.json
python3 - <<'PY'
import json
d = json.load(open("bench/results/kernels-gpu.json"))
print({k: v["result"] for k, v in d["kernels"].items()})
print({k: v["triton_rows_equal"] for k, v in d["matmul_invariance_8b_layers"].items()})
PY
timeout 200 python3 -m bench.exactness --modes exact,fast --requests 8 --max-prompt 4096 \
  --out $OUT/exactness-exact-fast-8.json 2>&1 | tail -6
