#!/usr/bin/env bash
# H200 call 4 (silu*up its own kernel, 64-row tiles for 17-64 rows, segments >= 4 blocks): kernel
# check, the Triton engine test alone (it failed in calls 2-3), GPU tests, bench_matmul,
# profile_busy and bench_device_rounds (acceptance 0.8, SmolLM2 shape, lanes 1 and 4).
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
timeout 60 python3 -m pytest -q -x tests/test_kernels.py -k engine_on_triton 2>&1 | grep -E "^E |assert|passed|failed" | head -20
timeout 200 python3 -m pytest -q tests/test_kernels.py tests/test_graphs.py tests/test_device_rounds.py 2>&1 | tail -3
timeout 100 python3 -m bench.bench_matmul --out $OUT/matmul.json 2>&1 | tail -40
timeout 100 python3 -m bench.profile_busy --overlap on --out $OUT/busy-after.json 2>&1 | grep lanes=
timeout 130 python3 -m bench.bench_device_rounds --acceptance 0.8 --lanes 1,4 --repeats 3 --new 256 \
    --out $OUT/device-rounds-0.8-after.json > /tmp/dr.log 2>&1 || tail -20 /tmp/dr.log
python3 - $OUT/device-rounds-0.8-after.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["rows"]:
    print(r["lanes"], {k: (round(r[k]["decode_tok_s_per_lane"]), round(r[k].get("speedup", 1), 2), round(r[k]["profile"]["wall_ms_per_step"], 2), round(r[k]["profile"]["kernel_ms_per_step"], 2), round(r[k]["profile"]["kernels_per_step"]), r[k]["outputs_equal_plain"]) for k in ("plain", "device_rounds")})
PY
