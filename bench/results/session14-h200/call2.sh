#!/usr/bin/env bash
# H200 call 2 (fourteenth session; one call, as refused starts ate the device time): decode
# GEMVs plan splits that come within a quarter of the target programs and step through K 128
# wide (call 1's sweep). Exactness (exact mode) on the 8B shape; matmul rows at M = 1, 37, 64,
# 128 against M = 4,096 for the 8B and SmolLM2 weights; GPU kernel tests; bench_speed with
# gpt-fast in the same run; decode steps and the 8K TTFT before (HEAD in .before/) and after.
export PYTHONUNBUFFERED=1
ROOT=$PWD  # .exp/ttft.py is results/session13-h200/exp/ttft.py
timeout 80 python3 -m bench.exactness --shape llama-3.1-8b --requests 6 --max-prompt 4096 \
  --modes exact --out $OUT/exactness-8b.json 2>&1 | grep -E "^(exact|fast)|Error|failed" | tail -4
timeout 60 python3 -c "
import json
from bench.kernel_check import matmul_invariance
r = matmul_invariance(3)
print(json.dumps(r))
print('rows equal:', {k: v['triton_rows_equal'] for k, v in r.items()}, 'cublas (control):', {k: v['cublas_rows_equal'] for k, v in r.items()})
" > $OUT/matmul-rows.log 2>&1; tail -1 $OUT/matmul-rows.log
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py \
  2>&1 | tee $OUT/tests.log | grep -E "passed|failed|FAILED|Error" | tail -8
timeout 220 python3 -m bench.bench_speed --peers .peers --repeats 2 --skip-32k > $OUT/speed.log 2>&1
grep -E "^[a-z]|median|gpt" $OUT/speed.log | head -30; cp bench/results/speed-*.json $OUT/ 2>/dev/null
for tree in .before .; do
  tag=$( [ $tree = . ] && echo after || echo before )
  (cd $tree && timeout 75 python3 -m bench.profile_busy --overlap on \
    --out $OUT/busy-$tag.json 2>&1 | grep "lanes=" )
done
for tree in .before .; do
  tag=$( [ $tree = . ] && echo after || echo before )
  (cd $tree && PYTHONPATH=. timeout 45 python3 $ROOT/.exp/ttft.py 8192 2>&1 | tail -1 \
    | tee $OUT/ttft-$tag.json)
done
