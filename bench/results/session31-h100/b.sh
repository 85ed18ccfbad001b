#!/usr/bin/env bash
# session 31, call 2 (issue 41), real weights: the GGUF from call 1's part and this call's.
# 1) does a device round keep the head's drafts as often as a host-managed one? The everyday
#    held-out set at k = 4, device rounds on (where they run) and off, at batch 1 and in one batch
# 2) drafting at load after 605cec7 (plain rounds priced by a median), never measured on a GPU
export PYTHONUNBUFFERED=1 LANES_CACHE=/root/keep/cache PYTHONPATH=$PWD/.gpu/py
mkdir -p /root/keep/cache
g=/root/keep/cache/SmolLM2-135M-Instruct.Q4_1.gguf
[ -s $g ] || cat /root/keep/gpart.aa .gpu/p2/gpart.ab .gpu/p2/gpart.ac | gunzip > $g
sha256sum $g | tee $OUT/sha.txt
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/gpu.txt
H=drafter/weights/smollm2-135m-instruct
timeout 200 python -m bench.drafters.acceptance --set everyday --drafters $H --device cuda \
  --device-rounds both --batch 1 > $OUT/accept-b1.log 2>&1
cp bench/results/drafter-acceptance-everyday-cuda-rounds-both-b1.json $OUT/ 2>/dev/null
grep '^{' $OUT/accept-b1.log | cut -c1-330
timeout 80 python -m bench.drafters.acceptance --set everyday --drafters $H --device cuda \
  --device-rounds both > $OUT/accept-all.log 2>&1
cp bench/results/drafter-acceptance-everyday-cuda-rounds-both.json $OUT/ 2>/dev/null
grep '^{' $OUT/accept-all.log | cut -c1-330
timeout 250 python -m bench.drafters.concurrency --device cuda --concurrency 1,4,16,64 --prompts 32 \
  --new-tokens 96 --passes 2 --warm --verbose > $OUT/load.log 2>&1
cp bench/results/drafters-concurrency-cuda.json $OUT/load.json
grep -v "INFO:lanes:device rounds" $OUT/load.log | tail -6; grep -c "device rounds paused" $OUT/load.log
