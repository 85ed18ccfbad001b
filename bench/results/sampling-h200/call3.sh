#!/usr/bin/env bash
# H200 call 3: the sampling kernel with per-slot accumulators (one cross-thread reduction per
# pass) and cached device parameters; GPU tests, kernel bench, device rounds seeded and greedy
# (SmolLM2 shape, acceptance 0.8, k = 4), bench.exactness (8B shape).
export PYTHONUNBUFFERED=1
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_device_rounds.py \
  > $OUT/gpu-tests.log 2>&1; tail -2 $OUT/gpu-tests.log
timeout 90 python3 -m bench.bench_sampling --part kernel --out $OUT/kernel.json | grep -v "R64 greedy\|R1 greedy"
for t in 0.7 0; do
  timeout 150 python3 -m bench.bench_device_rounds --temperature $t --top-p 0.9 --acceptance 0.8 \
    --lanes 1,4 --new 128 --repeats 3 --out $OUT/device-rounds-t$t.json > /dev/null 2>&1
  python3 - $OUT/device-rounds-t$t.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["rows"]:
    print("T", d["temperature"], "lanes", r["lanes"], {m: (round(r[m]["decode_tok_s_per_lane"]), round(r[m].get("speedup", 1), 2), r[m]["outputs_equal_plain"]) for m in ("plain", "host_rounds", "device_rounds")})
PY
done
timeout 170 python3 -m bench.exactness --modes exact,fast --requests 8 --max-prompt 1024 \
  --out $OUT/exactness.json > $OUT/exactness.log 2>&1; tail -5 $OUT/exactness.log
