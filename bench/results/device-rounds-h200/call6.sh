#!/usr/bin/env bash
# H200 call 6 (after the fused round layout and running to the last token): GPU tests, then
# bench_device_rounds at acceptance 0.8 and 0.5, lanes 1, 4, 16.
export PYTHONUNBUFFERED=1
timeout 200 python3 -m pytest -q tests/test_device_rounds.py tests/test_graphs.py 2>&1 | tail -3
for p in 0.8 0.5; do
timeout 170 python3 -m bench.bench_device_rounds --acceptance $p --lanes 1,4,16 --repeats 3 --new 256 \
  --out $OUT/device-rounds-$p.json > /tmp/dr-$p.log 2>&1 || tail -20 /tmp/dr-$p.log
python3 - $OUT/device-rounds-$p.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["rows"]:
    print(d["acceptance_set"], r["lanes"], {k: (round(r[k]["decode_tok_s_per_lane"]), round(r[k].get("speedup", 1), 2), round(r[k]["profile"]["wall_ms_per_step"], 2), round(r[k]["profile"]["kernel_ms_per_step"], 2), round(r[k]["profile"]["gaps_under_20us_ms_per_step"], 2), round(r[k]["profile"]["gaps_over_20us_ms_per_step"], 2), round(r[k]["profile"]["kernels_per_step"]), round(r[k]["tokens_per_target_step"], 2), r[k]["outputs_equal_plain"]) for k in ("plain", "host_rounds", "device_rounds")})
PY
done
