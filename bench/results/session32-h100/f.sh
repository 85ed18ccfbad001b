#!/usr/bin/env bash
# session 32, call 5 (issue 41): drafting lanes that draft nothing. Random weights of the default
# model's shape, the shipped head alone (never kept on a random target: drafting turns off).
# The working tree (fewer per-lane calls, the whole prompt-cache hit where the head skips the
# prompt) against 335785d, same call, 16 and 64 lanes, round by round at 16; then the working
# tree with Python's garbage collector off
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv > $OUT/gpu.txt
python -m bench.random_checkpoint --tokenizer .gpu/g/tok --out /tmp/rand135 > /dev/null
H=drafter/weights/smollm2-135m-instruct
cp -r drafter/weights .gpu/tbase/drafter/ && cp -r bench/data .gpu/tbase/bench/ && mkdir -p .gpu/tbase/bench/results
A="--model /tmp/rand135 --drafter $H --device cuda --concurrency 16 --prompts 64 --new-tokens 96 --passes 3 --warm --rounds 16"
for t in . .gpu/tbase; do n=new; [ $t = . ] || n=335785d; [ -e $OUT/r-$n.json ] && n=$n-again
  (cd $t && timeout 80 python -m bench.drafters.concurrency $A > $OUT/r-$n.log 2>&1
   cp bench/results/drafters-concurrency-cuda.json $OUT/r-$n.json
   cp bench/results/drafters-concurrency-rounds-cuda-c16.json $OUT/r-rounds-$n.json)
  echo "== $n"; grep '^{' $OUT/r-$n.log
done
