# H200 call 3 of 4: train the head on the answers of call 2 (read back), then acceptance on
# the everyday held-out set and the corpus held-out set, shipped head vs new head.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site LANES_CACHE=/root/keep/cache HF_HUB_OFFLINE=1
N=/root/keep/out; S=$PWD/drafter/weights/smollm2-135m-instruct
timeout 400 python3 -m lanes.cli distill --device cuda --out $N --prompts 8192 \
  --answered 4096 --held-out 16 --everyday 12288 --everyday-file /root/keep/everyday.json \
  --answers /root/keep/answers.jsonl.gz --new-tokens 128 --teacher-batch 1024 \
  --max-teacher-seconds 1 --depth 4 --batch 64 --lr 8e-4 --steps 100000 \
  --max-train-seconds 270 > $OUT/distill.json 2> >(grep -v "it/s\]" > $OUT/distill.log)
cp $N/model.safetensors $N/config.json $N/drafter.json $N/loss.png $OUT/
tail -3 $OUT/distill.log
for set in everyday corpus; do
  timeout 150 python3 -m bench.drafter_acceptance --set $set --device cuda --prompts 16 \
    --drafters ngram,$S,$S+ngram,$N,$N+ngram 2>&1 | tail -2
done
cp bench/results/drafter-acceptance-*cuda*.json $OUT/ 2>/dev/null; ls $OUT
