# H200 call 6: cost-aware drafting (off/on) with the shipped pair and n-gram, batch 1, everyday
# prompts, real weights, drafting lanes' plain rounds overlapped; then bench.exactness (exact).
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site LANES_CACHE=/root/keep/cache HF_HUB_OFFLINE=1
G=$LANES_CACHE/SmolLM2-135M-Instruct.Q4_1.gguf
cat /root/keep/part-aa .gg2/part-ab .gg2/part-ac > $G || exit 1
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $G" | sha256sum -c || exit 1
S=$PWD/drafter/weights/smollm2-135m-instruct
timeout 150 python3 -m bench.bench_drafters --device cuda --everyday 9 --new-tokens 96 \
  --repeats 2 --distilled $S --only ngram,distilled+ngram --cost-aware both > /dev/null 2>&1
cp "bench/results/drafters-ngram-distilled+ngram-everyday-cost-aware-both-cuda.json" $OUT/cost-aware.json
python3 -c "import json; d=json.load(open('$OUT/cost-aware.json'))['drafters']; print({k: (round(v['speedup'], 3), round(v['tokens_per_target_forward'], 2), v['outputs_equal_undrafted']) for k, v in d.items()})"
timeout 200 python3 -m bench.exactness --modes exact --requests 16 --max-prompt 2048 \
  --out $OUT/exactness.json 2>&1 | tail -4
