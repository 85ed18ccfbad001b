#!/usr/bin/env bash
# H200 call 2 (thirteenth session): RoPE + KV write with up to 8 heads per program (an 8K
# prefill launched 328K programs of one head each; call 1's profile: 6.5 ms of 238). GPU tests
# of kernels and graphs, exactness on the 8B shape, per-kernel times (PDL off), decode steps and
# the 8K TTFT before (HEAD in .before/) and after; registers and spills of attention variants.
export PYTHONUNBUFFERED=1
ROOT=$PWD
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_graphs.py \
  2>&1 | tee $OUT/tests.log | grep -E "passed|failed|FAILED|Error" | tail -12
timeout 200 python3 -m bench.exactness --shape llama-3.1-8b --requests 6 --max-prompt 4096 \
  --out $OUT/exactness-8b.json 2>&1 | grep -E "^(exact|fast)|Error|failed" | tail -8
for tree in .before .; do
  tag=$( [ $tree = . ] && echo after || echo before )
  (cd $tree && PYTHONPATH=. timeout 100 python3 $ROOT/.exp/ttft.py 8192 2>&1 | tail -1 \
    | tee $OUT/ttft-$tag.json)
  (cd $tree && timeout 120 python3 -m bench.profile_busy --overlap on \
    --out $OUT/busy-$tag.json 2>&1 | grep "lanes=" )
done
LANES_PDL=0 timeout 150 python3 -m bench.profile_kernels --shapes llama-3.1-8b \
  --out $OUT/kernels-pdl0.json 2>&1 | tail -2
python3 - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/kernels-pdl0.json"))
for k, v in d.items():
    if isinstance(v, dict):
        print(k, round(v["device_ms"], 3), "ms")
        for n, e in list(v["kernels"].items())[:6]:
            print("   ", n[:40], round(e["us"], 1), "us", e["launches"])
PY
PYTHONPATH=. timeout 100 python3 .exp/attn_regs.py 2>&1 | tail -6
