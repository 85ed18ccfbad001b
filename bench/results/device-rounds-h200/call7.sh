#!/usr/bin/env bash
# H200 call 7: bench_device_rounds on the 8B shape (Llama-3.1-8B dims, embeddings tied for the
# head's LM head) with an untrained one-layer head of that width drafting over 32K token ids,
# acceptance 0.8 and 0.5, lanes 1 and 4.
export PYTHONUNBUFFERED=1
for p in 0.8 0.5; do
timeout 280 python3 -m bench.bench_device_rounds --shape llama-3.1-8b --drafter random --acceptance $p \
  --lanes 1,4 --repeats 2 --new 256 --out $OUT/device-rounds-8b-$p.json > /tmp/dr-$p.log 2>&1 || tail -20 /tmp/dr-$p.log
python3 - $OUT/device-rounds-8b-$p.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["rows"]:
    print(d["acceptance_set"], r["lanes"], {k: (round(r[k]["decode_tok_s_per_lane"]), round(r[k].get("speedup", 1), 2), round(r[k]["profile"]["wall_ms_per_step"], 2), round(r[k]["profile"]["kernel_ms_per_step"], 2), round(r[k]["profile"]["gaps_over_20us_ms_per_step"], 2), round(r[k]["tokens_per_target_step"], 2), r[k]["outputs_equal_plain"]) for k in ("plain", "host_rounds", "device_rounds")})
PY
done
