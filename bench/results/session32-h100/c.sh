#!/usr/bin/env bash
# session 32, call 3 (issue 41): where a drafting lane that drafts nothing spends host time.
# Random weights of the default model's shape with the real tokenizer (no GGUF), the shipped
# head alone (its drafts of a random target are never kept, so cost-aware k turns drafting off):
# drafted vs plain at 16 and 64 lanes, HEAD and 335785d (before a2008d5); then cProfile diffs
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/gpu.txt
python -m bench.random_checkpoint --tokenizer .gpu/g/tok --out /tmp/rand135
H=drafter/weights/smollm2-135m-instruct
cp -r drafter/weights .gpu/tbase/drafter/ && cp -r bench/data .gpu/tbase/bench/ && mkdir -p .gpu/tbase/bench/results
for t in . .gpu/tbase; do n=head; [ $t = . ] || n=335785d
  (cd $t && timeout 120 python -m bench.drafters.concurrency --model /tmp/rand135 --drafter $H \
    --device cuda --concurrency 16,64 --prompts 64 --new-tokens 96 --passes 3 --warm --rounds 16 \
    > $OUT/rand-$n.log 2>&1; cp bench/results/drafters-concurrency-cuda.json $OUT/rand-$n.json;
    cp bench/results/drafters-concurrency-rounds-cuda-c16.json $OUT/rand-rounds-$n.json)
  echo "== $n"; grep '^{' $OUT/rand-$n.log
done
PYTHONPATH=. timeout 100 python .gpu/g/diff.py /tmp/rand135 cuda 16 64 $H > $OUT/diff-head-c16.txt 2>&1
grep -v "^lanes:" $OUT/diff-head-c16.txt | head -36
(cd .gpu/tbase && PYTHONPATH=. timeout 100 python ../g/diff.py /tmp/rand135 cuda 16 64 $H > $OUT/diff-335785d-c16.txt 2>&1)
grep -v "^lanes:" $OUT/diff-335785d-c16.txt | head -8
