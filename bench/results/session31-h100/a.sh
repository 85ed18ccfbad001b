#!/usr/bin/env bash
# session 31, call 1: part 1 of the default model's GGUF kept for the next call; then issue 45's
# MoE routing kernels (76e4981) on a GPU for the first time: the kernel and MoE tests, the
# Qwen3.5-35B-A3B-like decode step beside the tree before them (cac915c), exactness
export PYTHONUNBUFFERED=1
mkdir -p /root/keep && cp .gpu/p1/gpart.aa /root/keep/ && ls -l /root/keep
nvidia-smi --query-gpu=name,memory.total --format=csv | tee $OUT/gpu.txt
timeout 150 python -m pytest -q -x tests/test_kernels.py tests/test_moe.py tests/test_glm4_moe.py \
  -p no:cacheprovider > $OUT/moe-tests.log 2>&1; tail -3 $OUT/moe-tests.log
for t in . .gpu/tcac915c; do
  n=$(basename $t); [ "$n" = . ] && n=head
  (cd $t && timeout 120 python -m bench.speed hybrid --shape qwen3.5-35b-a3b-like --skip-hf \
    --prefill 2048 --repeats 3 --new-tokens 128 --out $OUT/moe-step-$n.json > $OUT/moe-step-$n.log 2>&1)
  echo "== $n"; tail -5 $OUT/moe-step-$n.log
done
timeout 150 python -m bench.exactness --shape qwen3.5-35b-a3b-like --modes exact --kv-gib 4 \
  --requests 16 --max-prompt 2048 --out $OUT/exactness-35b.json > $OUT/exactness-35b.log 2>&1
tail -12 $OUT/exactness-35b.log
