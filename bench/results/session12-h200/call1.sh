#!/usr/bin/env bash
# H200 call 1 (twelfth session): the attention refactor of the last session (never run on the GPU)
# and the key partitions merged by their last arrival (a ticket) instead of a second launch
# (issue 17); before = HEAD 0518af5 in .before/ (carried). Per-kernel decode/prefill times with
# PDL off; the verify bucket's floor against decode's (issue 17's verify row).
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_graphs.py \
  2>&1 | tee $OUT/tests.log | grep -E "passed|failed|FAILED|Error" | tail -12
for tree in .before .; do
  tag=$( [ $tree = . ] && echo after || echo before )
  (cd $tree && timeout 60 python3 -m bench.bench_attention --decode --lengths 128 512 2048 8192 \
    --lanes 1 8 --out $OUT/attn-decode-$tag.json 2>&1 | tail -18)
  (cd $tree && timeout 120 python3 -m bench.profile_busy --overlap on \
    --out $OUT/busy-$tag.json 2>&1 | grep "lanes=" )
done
timeout 200 python3 -m bench.exactness --shape llama-3.1-8b --requests 6 --max-prompt 4096 \
  --out $OUT/exactness-8b.json 2>&1 | grep -E "^(exact|fast)|Error|failed" | tail -8
LANES_PDL=0 timeout 150 python3 -m bench.profile_kernels --out $OUT/kernels-pdl0.json 2>&1 | tail -5
python3 - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/kernels-pdl0.json"))
for k, v in d.items():
    if isinstance(v, dict):
        print(k, round(v["device_ms"], 3), "ms")
        for n, e in list(v["kernels"].items())[:7]:
            print("   ", n[:40], round(e["us"], 1), "us", e["launches"])
PY
timeout 120 python3 -m bench.graph_floor --out $OUT/graph-floor.json 2>&1 | tail -12
