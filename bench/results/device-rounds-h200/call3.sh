#!/usr/bin/env bash
# H200 call 3: the default model's real weights (SmolLM2-135M-Instruct Q4_1 GGUF, assembled from
# call 2's part and this call's two), batch 1, 9 everyday prompts, 96 new tokens: n-gram, the
# shipped head and the shipped pair (`make serve`'s drafter), device rounds off and on.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site LANES_CACHE=/root/keep/cache HF_HUB_OFFLINE=1
G=$LANES_CACHE/SmolLM2-135M-Instruct.Q4_1.gguf
cat /root/keep/part-aa .gg2/part-ab .gg2/part-ac > $G || exit 1
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $G" | sha256sum -c || exit 1
S=$PWD/drafter/weights/smollm2-135m-instruct
timeout 420 python3 -m bench.bench_drafters --device cuda --everyday 9 --new-tokens 96 \
  --repeats 2 --distilled $S --only ngram,distilled+ngram --device-rounds both > /tmp/drafters.log 2>&1 || tail -30 /tmp/drafters.log
tail -8 /tmp/drafters.log
cp bench/results/drafters-ngram-distilled+ngram-everyday-device-rounds-both-cuda.json $OUT/drafters-device-rounds.json
