#!/usr/bin/env bash
# H200 call 2 (a barrier before the split-K arrival count: call 1 found rows differing on two
# SmolLM2 shapes): kernel check with repeated launches, GPU tests, then profile_busy before
# (.before = 9973898) and after, and bench_device_rounds at acceptance 0.8 on the old tree.
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
for tree in before after; do
  dir=.; [ $tree = before ] && dir=.before
  (cd $dir && timeout 100 python3 -m bench.profile_busy --overlap on --out $OUT/busy-$tree.json 2>&1 | grep lanes= | sed "s/^/$tree /")
done
(cd .before && timeout 130 python3 -m bench.bench_device_rounds --acceptance 0.8 --lanes 1,4 --repeats 3 --new 256 \
  --out $OUT/device-rounds-0.8-before.json > /tmp/dr-before.log 2>&1 || tail -20 /tmp/dr-before.log)
python3 - $OUT/device-rounds-0.8-before.json before <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["rows"]:
    print(sys.argv[2], r["lanes"], {k: (round(r[k]["decode_tok_s_per_lane"]), round(r[k].get("speedup", 1), 2), round(r[k]["profile"]["wall_ms_per_step"], 2), round(r[k]["profile"]["kernel_ms_per_step"], 2), round(r[k]["profile"]["kernels_per_step"]), r[k]["outputs_equal_plain"]) for k in ("plain", "device_rounds")})
PY
