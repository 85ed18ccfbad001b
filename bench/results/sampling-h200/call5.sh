#!/usr/bin/env bash
# H200 call 5: graphs captured and samplers compiled at build (lanes/warmup.py): GPU tests,
# c64 round by round again, seeded device rounds (the bench recaptures its buckets).
export PYTHONUNBUFFERED=1
timeout 230 python3 -m pytest -q -p no:cacheprovider tests/test_graphs.py tests/test_device_rounds.py \
  tests/test_kernels.py tests/test_overlap.py -k "not server" > $OUT/gpu-tests.log 2>&1; tail -3 $OUT/gpu-tests.log
python3 - <<'PY'
import logging, time
logging.basicConfig(level=logging.INFO, format="%(message)s")
from bench.shapes import LLAMA_31_8B, random_checkpoint
from lanes import EngineConfig, build_engine
t = time.perf_counter()
build_engine(checkpoint=random_checkpoint(LLAMA_31_8B, "cuda"), config=EngineConfig(device="cuda", kv_cache_bytes=8 * 2**30))
print(f"8B engine built in {time.perf_counter() - t:.1f} s")
PY
timeout 200 python3 -m bench.c64_rounds --runs 3 --seeded-runs 1 --out $OUT/c64-rounds.json
timeout 150 python3 -m bench.bench_device_rounds --temperature 0.7 --top-p 0.9 --acceptance 0.8 \
  --lanes 1,4 --new 128 --repeats 3 --out $OUT/device-rounds-t0.7.json > /dev/null 2>&1
python3 - $OUT/device-rounds-t0.7.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["rows"]:
    print("T", d["temperature"], "lanes", r["lanes"], {m: (round(r[m]["decode_tok_s_per_lane"]), round(r[m].get("speedup", 1), 2), r[m]["outputs_equal_plain"]) for m in ("plain", "host_rounds", "device_rounds")})
PY
