#!/usr/bin/env bash
# issue 41: the stronger head: the rest of the answers, then training on twice the everyday prompts
export PYTHONUNBUFFERED=1 LANES_CACHE=/root/keep/cache PYTHONPATH=$PWD/.gpu/py
ls /root/keep/cache || exit 3
timeout 560 python -c "import sys; from lanes.cli import main; sys.exit(main())" distill \
  --device cuda --out /root/keep/head-new --everyday 24576 \
  --everyday-file /root/keep/everyday.json --prompts 8192 --answered 4096 \
  --answers /root/keep/answers.jsonl.gz --max-teacher-seconds 190 \
  --depth 4 --batch 64 --steps 100000 --max-train-seconds 250 --held-out 32 > $OUT/distill.log 2>&1
grep -v "losses" $OUT/distill.log | grep -E "teacher|everyday|step [0-9]*00 |accepted|tokens_per|seconds" | tail -30
mkdir -p $OUT/head-new && cp /root/keep/head-new/* $OUT/head-new/
