#!/usr/bin/env bash
# H200 call 2 (twelfth session, issue 17): partitions merged by the last arrival (call 1), the
# empty split programs leave before loading queries, the layout read before the PDL wait, and
# the down projection's silu(gate) * up made in its prologue for decode-sized batches (one
# launch fewer per layer). before = HEAD 0518af5 (.before/); .s11 = 8510083, the tree whose
# 64-lane device time was 5.1-5.4 ms in the last session (call 1 here showed 7.6 in both trees).
export PYTHONUNBUFFERED=1
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_graphs.py \
  2>&1 | tee $OUT/tests.log | grep -E "passed|failed|FAILED|Error" | tail -12
timeout 150 python3 -m bench.kernel_check > $OUT/kernel-check.log 2>&1
python3 - <<'PY'
import json
d = json.load(open("bench/results/kernels-gpu.json"))
print({k: v["result"] for k, v in d["kernels"].items()})
print({k: {x: y for x, y in v.items() if "equal" in x} for k, v in d["matmul_invariance_8b_layers"].items()})
PY
cp bench/results/kernels-gpu.json $OUT/
for tree in .s11 .before .; do
  tag=$( [ $tree = . ] && echo after || echo ${tree#.} )
  shapes="smollm2-135m llama-3.1-8b"; [ $tree = .s11 ] && shapes=llama-3.1-8b
  (cd $tree && timeout 120 python3 -m bench.profile_busy --overlap on --shapes $shapes \
    --out $OUT/busy-$tag.json 2>&1 | grep "lanes=" | cut -c1-220)
done
LANES_PDL=0 timeout 150 python3 -m bench.profile_kernels --lanes 1 64 --prefill 0 \
  --out $OUT/kernels-pdl0.json > /dev/null 2>&1
(cd .s11 && cp ../bench/profile_kernels.py bench/ && LANES_PDL=0 timeout 100 python3 -m bench.profile_kernels \
  --lanes 64 --prefill 0 --shapes llama-3.1-8b --out $OUT/kernels-pdl0-s11.json > /dev/null 2>&1)
python3 - <<'PY'
import json, os
for f in ("kernels-pdl0.json", "kernels-pdl0-s11.json"):
    d = json.load(open(os.environ["OUT"] + "/" + f))
    for k, v in d.items():
        if isinstance(v, dict):
            print(f, k, round(v["device_ms"], 3), "ms")
            for n, e in list(v["kernels"].items())[:7]:
                print("   ", n[:40], round(e["us"], 1), "us", e["launches"])
PY
timeout 200 python3 -m bench.exactness --shape llama-3.1-8b --requests 6 --max-prompt 4096 \
  --modes exact --out $OUT/exactness-8b.json 2>&1 | grep -E "^(exact|fast)|Error|failed" | tail -8
timeout 240 python3 -m bench.bench_speed --peers .peers --skip-32k --repeats 3 2>&1 | tail -14
cp bench/results/speed-cuda.json $OUT/ 2>/dev/null
