#!/usr/bin/env bash
# H200 call 3 (thirteenth session; the last device minutes after an hour of refused starts):
# the tree as it would land, with the down projection's silu(gate) * up made in the prefill
# tiles' prologue (matmul.glu_matmul); before = HEAD without it, in .before/. GPU kernel tests,
# exactness (exact mode), the fused projection's time and bits, the 8K TTFT before/after; then
# experiments for the next session (.exp/): decode GEMV stages, warps, BLOCK_K 128;
# add_rms_norm warps; the 64-lane step's kernels.
export PYTHONUNBUFFERED=1
ROOT=$PWD
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py 2>&1 \
  | tee $OUT/tests.log | grep -E "passed|failed|FAILED|Error" | tail -8
timeout 100 python3 -m bench.exactness --shape llama-3.1-8b --requests 6 --max-prompt 4096 \
  --modes exact --out $OUT/exactness-8b.json 2>&1 | grep -E "^(exact|fast)|Error|failed" | tail -4
PYTHONPATH=. timeout 60 python3 .exp/glu_real.py 2>&1 | tee $OUT/glu-real.log | tail -4
for tree in .before .; do
  tag=$( [ $tree = . ] && echo after || echo before )
  (cd $tree && PYTHONPATH=. timeout 70 python3 $ROOT/.exp/ttft.py 8192 2>&1 | tail -1 \
    | tee $OUT/ttft-$tag.json)
done
PYTHONPATH=. timeout 100 python3 .exp/gemv_stages.py 2>&1 | tee $OUT/gemv-stages.log | tail -6
PYTHONPATH=. timeout 40 python3 .exp/norm_warps.py 2>&1 | tee $OUT/norm-warps.log | tail -6
LANES_PDL=0 timeout 80 python3 -m bench.profile_kernels --shapes llama-3.1-8b --prefill 0 \
  --lanes 64 --out $OUT/kernels-64.json 2>&1 | tail -1 | cut -c1-500
