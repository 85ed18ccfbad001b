#!/usr/bin/env bash
# issue 41: the new head against the shipped one: everyday acceptance (chains, trees of 3), then at load
export PYTHONUNBUFFERED=1 LANES_CACHE=/root/keep/cache PYTHONPATH=$PWD/.gpu/py
ls /root/keep/head-new || exit 3
timeout 200 python -m bench.drafters acceptance --set everyday --device cuda --branches 1,3 \
  --drafters drafter/weights/smollm2-135m-instruct,/root/keep/head-new > $OUT/acceptance.log 2>&1
cp bench/results/drafter-acceptance-everyday-cuda.json $OUT/acceptance.json
grep -E "tokens_per_verify|drafter|branches" $OUT/acceptance.log | head -30
timeout 240 python -m bench.drafters concurrency --device cuda --concurrency 1,4,16,64 --prompts 32 \
  --new-tokens 96 --passes 2 --warm --drafter /root/keep/head-new+ngram > $OUT/load-new.log 2>&1
cp bench/results/drafters-concurrency-cuda.json $OUT/load-new.json
grep -v "INFO:lanes:device rounds" $OUT/load-new.log | tail -8
