#!/usr/bin/env bash
# session 32, call 4 (issue 41): cProfile diff of drafted vs plain at 16 lanes in the paused
# state (HEAD), random weights of the default model's shape, the shipped head alone; rounds file
export PYTHONUNBUFFERED=1
python -m bench.random_checkpoint --tokenizer .gpu/g/tok --out /tmp/rand135 > /dev/null
H=drafter/weights/smollm2-135m-instruct
PYTHONPATH=. timeout 150 python .gpu/g/diff.py /tmp/rand135 cuda 16 64 $H > $OUT/diff2-head-c16.txt 2>&1
grep -v "^lanes:" $OUT/diff2-head-c16.txt | head -60
timeout 100 python -m bench.drafters.concurrency --model /tmp/rand135 --drafter $H --device cuda \
  --concurrency 16 --prompts 64 --new-tokens 96 --passes 3 --warm --rounds 16 > $OUT/rand2-head.log 2>&1
cp bench/results/drafters-concurrency-rounds-cuda-c16.json $OUT/rand2-rounds-head.json; grep '^{' $OUT/rand2-head.log
