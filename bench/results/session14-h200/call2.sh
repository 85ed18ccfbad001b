#!/usr/bin/env bash
# H200 call 2 (fourteenth session): decode GEMVs plan splits that come within a quarter of the
# target programs and step through K 128 wide (call 1's sweep). GPU tests of kernels and graphs,
# exactness (exact mode) on the 8B shape, matmul rows at M = 1, 37, 64, 128 against M = 4,096
# for the 8B and SmolLM2 weights; the 8K TTFT and decode steps before (HEAD in .before/) and after.
export PYTHONUNBUFFERED=1
ROOT=$PWD
timeout 180 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_graphs.py \
  2>&1 | tee $OUT/tests.log | grep -E "passed|failed|FAILED|Error" | tail -12
timeout 90 python3 -m bench.exactness --shape llama-3.1-8b --requests 6 --max-prompt 4096 \
  --modes exact --out $OUT/exactness-8b.json 2>&1 | grep -E "^(exact|fast)|Error|failed" | tail -4
timeout 70 python3 -c "
import json
from bench.kernel_check import matmul_invariance
r = matmul_invariance(3)
print(json.dumps(r))
print('rows equal:', {k: v['triton_rows_equal'] for k, v in r.items()}, 'cublas (control):', {k: v['cublas_rows_equal'] for k, v in r.items()})
" > $OUT/matmul-rows.log 2>&1; tail -1 $OUT/matmul-rows.log
for tree in .before .; do
  tag=$( [ $tree = . ] && echo after || echo before )
  (cd $tree && PYTHONPATH=. timeout 60 python3 $ROOT/.exp/ttft.py 8192 2>&1 | tail -1 \
    | tee $OUT/ttft-$tag.json)
  (cd $tree && timeout 90 python3 -m bench.profile_busy --overlap on \
    --out $OUT/busy-$tag.json 2>&1 | grep "lanes=" )
done
