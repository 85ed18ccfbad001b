#!/usr/bin/env bash
# H200 call 6: side by side in one run: bench_speed (batch-1 decode exact vs fast, 8K prefill; the
# 32K prefill skipped for time) and gpt-fast on the SmolLM2 and 8B shapes.
export PYTHONUNBUFFERED=1
timeout 300 python3 .peers/run_gptfast.py smollm2-135m llama-3.1-8b > $OUT/gptfast.jsonl 2>/tmp/gf.log || tail -5 /tmp/gf.log
cat $OUT/gptfast.jsonl
timeout 280 python3 -m bench.bench_speed --skip-32k --repeats 3 > /tmp/speed.log 2>&1 || tail -20 /tmp/speed.log
cp bench/results/speed-cuda.json $OUT/speed.json
python3 - <<'PY'
import json
d = json.load(open("bench/results/speed-cuda.json"))
for shape in ("smollm2-135m", "llama-3.1-8b"):
    e = d[shape]
    print(shape, {m: round(v["median"], 1) for m, v in e["decode_tok_s"].items()},
          {k: {m: round(v["median"], 3) for m, v in e[k].items()} for k in e if k.startswith("prefill")})
PY
