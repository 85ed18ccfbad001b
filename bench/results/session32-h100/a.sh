#!/usr/bin/env bash
# session 32, call 1: part 1 of the default model's GGUF and the gguf package kept for call 2;
# bench.exactness on the 8B shape (exact + fast, chains; exact with trees of 3) after a0be5ea
# and a2008d5; the 35B-A3B-like step kernel by kernel (issue 45)
export PYTHONUNBUFFERED=1
mkdir -p /root/keep && cp .gpu/p1/gpart.aa /root/keep/ && cp -r .gpu/py /root/keep/ && ls -l /root/keep
nvidia-smi --query-gpu=name,memory.total --format=csv | tee $OUT/gpu.txt
timeout 200 python -m bench.exactness --shape llama-3.1-8b --modes exact,fast --requests 32 \
  --max-prompt 2048 --kv-gib 20 --out $OUT/exactness-8b.json > $OUT/exactness-8b.log 2>&1
grep -E "greedy|seeded|Error" $OUT/exactness-8b.log | cut -c1-240
timeout 120 python -m bench.exactness --shape llama-3.1-8b --modes exact --requests 32 \
  --max-prompt 2048 --kv-gib 20 --draft-branches 3 --out $OUT/exactness-8b-trees.json \
  > $OUT/exactness-8b-trees.log 2>&1
grep -E "greedy|seeded|Error" $OUT/exactness-8b-trees.log | cut -c1-240
LANES_PDL=0 timeout 150 python -m bench.profile.kernels --shapes qwen3.5-35b-a3b-like --prefill 2048 \
  --steps 30 --lanes 1 --out $OUT/profile-kernels-35b.json > $OUT/profile-kernels-35b.log 2>&1
tail -30 $OUT/profile-kernels-35b.log | cut -c1-200
