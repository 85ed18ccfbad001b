# H200 call 4 of 4: everyday acceptance, shipped pair vs new pair (call 3's run of this timed
# out after the new head alone), and batch-1 speed on everyday prompts (real weights).
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site LANES_CACHE=/root/keep/cache HF_HUB_OFFLINE=1
N=/root/keep/out; S=$PWD/drafter/weights/smollm2-135m-instruct
timeout 130 python3 -m bench.drafter_acceptance --set everyday --device cuda \
  --drafters $S+ngram,$N+ngram 2>&1 | cut -c1-330
cp bench/results/drafter-acceptance-everyday-cuda.json $OUT/
for h in new shipped; do
  d=$N; [ $h = shipped ] && d=$S
  timeout 140 python3 -m bench.bench_drafters --device cuda --everyday 9 --new-tokens 96 \
     --repeats 2 --distilled $d --only ngram,distilled,distilled+ngram > /dev/null 2>&1
  cp bench/results/drafters-ngram-distilled-distilled+ngram-everyday-cuda.json $OUT/drafters-$h.json
  python3 -c "import json; d=json.load(open('$OUT/drafters-$h.json'))['drafters']; print('$h', {k: (round(v['speedup'], 3), round(v['tokens_per_target_forward'], 2), v['outputs_equal_undrafted']) for k, v in d.items()})"
done
