#!/usr/bin/env bash
# session 32, call 2 (issue 41), real weights: the GGUF from call 1's part and this call's.
# drafting at load (1/4/16/64) after a0be5ea (the head's prompt-cache reach), f674ab4 (retry
# back-off) and a2008d5 (no per-lane tensor ops where a lane drafts nothing); then the tree
# before a2008d5 (335785d) at 16 and 64 beside it, for that change alone
export PYTHONUNBUFFERED=1 LANES_CACHE=/root/keep/cache PYTHONPATH=/root/keep/py
mkdir -p /root/keep/cache
g=/root/keep/cache/SmolLM2-135M-Instruct.Q4_1.gguf
[ -s $g ] || cat /root/keep/gpart.aa .gpu/p2/gpart.ab | gunzip > $g
sha256sum $g | tee $OUT/sha.txt
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/gpu.txt
timeout 260 python -m bench.drafters.concurrency --device cuda --concurrency 1,4,16,64 --prompts 32 \
  --new-tokens 96 --passes 2 --warm --verbose > $OUT/load.log 2>&1
cp bench/results/drafters-concurrency-cuda.json $OUT/load.json
grep '^{' $OUT/load.log; grep -c "device rounds paused" $OUT/load.log
cp -r drafter/weights .gpu/tbase/drafter/ && cp -r bench/data .gpu/tbase/bench/ && mkdir -p .gpu/tbase/bench/results
(cd .gpu/tbase && timeout 150 python -m bench.drafters.concurrency --device cuda --concurrency 16,64 \
  --prompts 32 --new-tokens 96 --passes 2 --warm > $OUT/load-335785d.log 2>&1;
  cp bench/results/drafters-concurrency-cuda.json $OUT/load-335785d.json)
grep '^{' $OUT/load-335785d.log
timeout 100 python -m bench.drafters.concurrency --device cuda --concurrency 16,64 --prompts 32 \
  --new-tokens 96 --passes 2 --warm > $OUT/load-again.log 2>&1
cp bench/results/drafters-concurrency-cuda.json $OUT/load-again.json; grep '^{' $OUT/load-again.log
