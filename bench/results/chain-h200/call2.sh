#!/usr/bin/env bash
# H200 call 2 for the chained drafter graph: the catch-up forward folded into the chain (one
# replay per drafter round); GPU tests, traces both ways, 8B + 1B spec both ways, a cProfile.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv,noheader
timeout 200 python3 -m pytest -q -x tests/test_graphs.py tests/test_graph_rows.py 2>&1 | tail -15
for acc in 0.5 0.8; do
  for mode in no-chain chain; do
    flag=""; [ "$mode" = no-chain ] && flag="--no-chain"
    timeout 120 python3 -m bench.trace_spec_round --acceptance $acc $flag \
      --out "$OUT/trace-$acc-$mode.json" > /tmp/trace.log 2>&1 || tail -20 /tmp/trace.log
    python3 -c "import json,sys; r=json.load(open(sys.argv[1])); d=r['drafted']; print(sys.argv[1], 'chained', r['chained'], 'round ms %.2f device %.2f propose host %.2f tok/s %.0f plain %.0f speedup %.2f' % (d['wall_ms_per_round'], d['device_ms_per_round'], d['drafter_host_ms_median'], d['tok_s'], r['plain']['tok_s'], r['speedup']))" "$OUT/trace-$acc-$mode.json"
  done
done
for mode in no-chain chain; do
  flag=""; [ "$mode" = no-chain ] && flag="--no-chain"
  timeout 150 python3 -m bench.bench_engine --sections spec --accs 0.8 --ks 4 $flag \
    --out "$OUT/spec-8b-1b-$mode.json" > /tmp/spec.log 2>&1 || tail -20 /tmp/spec.log
  grep "^spec" /tmp/spec.log | tail -1
done
timeout 120 python3 -m bench.trace_spec_round --acceptance 0.8 --cprofile 40 \
  --out /tmp/cprof.json 2>&1 | grep -v Warn | sed -n '/function calls/,$p' > "$OUT/cprofile-0.8-chain.txt"
head -5 "$OUT/cprofile-0.8-chain.txt"
