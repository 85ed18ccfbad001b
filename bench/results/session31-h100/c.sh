#!/usr/bin/env bash
# session 31, call 3 (issue 41): at 16 and 64 lanes drafted passes drafted nothing (share 0.0)
# and still ran at 0.75-0.93x of plain: where does a drafted request's time go when it drafts
# nothing? cProfile of both at 16 (the bench's --profile)
export PYTHONUNBUFFERED=1 LANES_CACHE=/root/keep/cache PYTHONPATH=$PWD/.gpu/py
ls /root/keep/cache/*.gguf || exit 3
timeout 240 python -m bench.drafters.concurrency --device cuda --concurrency 16,64 --prompts 32 \
  --new-tokens 96 --passes 2 --warm --profile 16 > $OUT/load16.log 2>&1
cp bench/results/drafters-concurrency-cuda.json $OUT/load16.json
cp bench/results/drafters-concurrency-profile-cuda-c16.txt $OUT/ 2>/dev/null
tail -4 $OUT/load16.log
