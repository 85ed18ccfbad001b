#!/usr/bin/env bash
# Written in session 30 for the next device call (one call, random weights, no GGUF needed):
# the MoE routing kernels (76e4981) on a GPU for the first time, then the Qwen3.5-35B-A3B-like
# decode step beside the tree before them. Carry .gpu/tcac915c, made by
#   git archive cac915c lanes kernels bench drafter cache pyproject.toml | tar -x -C .gpu/tcac915c
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv > $OUT/gpu.txt
timeout 200 python -m pytest -q -x tests/test_kernels.py tests/test_moe.py tests/test_glm4_moe.py \
  -p no:cacheprovider > $OUT/moe-tests.log 2>&1; tail -3 $OUT/moe-tests.log
for t in . .gpu/tcac915c; do
  (cd $t && timeout 150 python -m bench.speed hybrid --shape qwen3.5-35b-a3b-like --skip-hf \
    > $OUT/moe-step-$(basename $t).log 2>&1); grep -iE "decode|step|tok/s" $OUT/moe-step-$(basename $t).log | tail -4
done
timeout 150 python -m bench.exactness --shape qwen3.5-35b-a3b-like --modes exact \
  --out $OUT/exactness-35b.json > $OUT/exactness-35b.log 2>&1; tail -12 $OUT/exactness-35b.log
