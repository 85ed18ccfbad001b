#!/usr/bin/env bash
# H200 call 16 (the rule on means since the rounds started): real weights, batch 1, 9 everyday prompts, 96 new tokens: the shipped pair with
# device rounds off/on and cost-aware drafts off/on (on: the CUDA default, so `make serve` on a
# GPU is the "device-rounds=on cost-aware=on" row).
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site LANES_CACHE=/root/keep/cache HF_HUB_OFFLINE=1
G=$LANES_CACHE/SmolLM2-135M-Instruct.Q4_1.gguf
cat /root/keep/p1 .gg4/p2 > $G || exit 1
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $G" | sha256sum -c || exit 1
S=$PWD/drafter/weights/smollm2-135m-instruct
timeout 400 python3 -m bench.bench_drafters --device cuda --everyday 9 --new-tokens 96 \
  --repeats 2 --distilled $S --only distilled+ngram --cost-aware both --device-rounds both > /tmp/drafters.log 2>&1 || tail -30 /tmp/drafters.log
tail -6 /tmp/drafters.log
cp bench/results/drafters-distilled+ngram-everyday-cost-aware-both-device-rounds-both-cuda.json $OUT/drafters-cost-4.json
