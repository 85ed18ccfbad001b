#!/usr/bin/env bash
# H200 call 1 (fewer, wider decode kernels: split-K reduced in-kernel, 32-column tiles and any
# divisor split for narrow weights, silu*up fused into the down projection, RoPE + KV write in one
# launch): kernel check, GPU tests, then before (.before = 9973898) and after: profile_busy
# (device time and kernels per step) and bench_device_rounds at acceptance 0.8 (plain and
# device-round tok/s), SmolLM2 shape. TREES="before" runs the old tree alone (call 2).
export PYTHONUNBUFFERED=1
timeout 120 python3 -m bench.kernel_check > /tmp/kc.log 2>&1; tail -3 /tmp/kc.log
cp bench/results/kernels-gpu.json $OUT/kernels-gpu.json
python3 - <<'PY'
import json
d = json.load(open("bench/results/kernels-gpu.json"))
print(json.dumps(d, indent=None)[:3000])
PY
timeout 200 python3 -m pytest -q -x tests/test_kernels.py tests/test_graphs.py tests/test_device_rounds.py 2>&1 | tail -4
for tree in ${TREES:-after}; do
  dir=.; [ $tree = before ] && dir=.before
  (cd $dir && timeout 100 python3 -m bench.profile_busy --overlap on --out $OUT/busy-$tree.json 2>&1 | grep lanes=)
  (cd $dir && timeout 130 python3 -m bench.bench_device_rounds --acceptance 0.8 --lanes 1,4 --repeats 3 --new 256 \
    --out $OUT/device-rounds-0.8-$tree.json > /tmp/dr-$tree.log 2>&1 || tail -20 /tmp/dr-$tree.log)
  python3 - $OUT/device-rounds-0.8-$tree.json $tree <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["rows"]:
    print(sys.argv[2], r["lanes"], {k: (round(r[k]["decode_tok_s_per_lane"]), round(r[k].get("speedup", 1), 2), round(r[k]["profile"]["wall_ms_per_step"], 2), round(r[k]["profile"]["kernel_ms_per_step"], 2), round(r[k]["profile"]["kernels_per_step"]), r[k]["outputs_equal_plain"]) for k in ("plain", "device_rounds")})
PY
done
