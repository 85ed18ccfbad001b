# H200 call 4 of 4: batch-1 speed on everyday prompts (real weights): the new head and the
# shipped one, and the shipped one on the tree before device drafts (66a2340), same call.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site LANES_CACHE=/root/keep/cache HF_HUB_OFFLINE=1
N=/root/keep/out; S=$PWD/drafter/weights/smollm2-135m-instruct
run() {  # tree name head
  (cd $1 && timeout 150 python3 -m bench.bench_drafters --device cuda --everyday 18 \
     --new-tokens 96 --repeats 3 --distilled $3 --only ngram,distilled,distilled+ngram \
     > /dev/null 2>&1; cp bench/results/drafters-ngram-distilled-distilled+ngram-everyday-cuda.json $OUT/drafters-$2.json)
}
run . new $N; run . shipped $S; run .before shipped-before $S
python3 - <<'PY'
import json, os, glob
for f in sorted(glob.glob(os.environ["OUT"] + "/drafters-*.json")):
    d = json.load(open(f))
    rows = d.get("drafters", d)
    print(os.path.basename(f), {k: (round(v["speedup"], 3), round(v["tokens_per_target_forward"], 2), v["outputs_equal_undrafted"]) for k, v in rows.items() if isinstance(v, dict) and "speedup" in v})
PY
