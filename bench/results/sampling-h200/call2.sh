#!/usr/bin/env bash
# H200 call 2: GPU tests (kernels, device rounds greedy + seeded, graphs, overlap), the sampling
# kernel alone as a graph replay, and seeded device rounds (SmolLM2 shape, acceptance 0.8).
export PYTHONUNBUFFERED=1
timeout 260 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_device_rounds.py \
  tests/test_graphs.py tests/test_overlap.py -k "not server" > $OUT/gpu-tests.log 2>&1; tail -4 $OUT/gpu-tests.log
timeout 100 python3 -m bench.bench_sampling --part kernel --out $OUT/kernel.json
timeout 200 python3 -m bench.bench_device_rounds --temperature 0.7 --top-p 0.9 --acceptance 0.8 \
  --lanes 1,4 --new 128 --repeats 3 --out $OUT/device-rounds-seeded.json > $OUT/device-rounds-seeded.log 2>&1
python3 - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/device-rounds-seeded.json"))
for r in d["rows"]:
    print(r["lanes"], {m: (round(r[m]["decode_tok_s_per_lane"]), round(r[m].get("speedup", 1), 2), r[m]["outputs_equal_plain"], round(r[m]["tokens_per_target_step"], 2)) for m in ("plain", "host_rounds", "device_rounds")})
PY
tail -3 $OUT/device-rounds-seeded.log
