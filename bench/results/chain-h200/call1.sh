#!/usr/bin/env bash
# One H200 call for the chained drafter graph (issue 15 item 6): GPU tests, then the drafting
# round traced with the head's steps as separate replays and as one chain, then the 8B + 1B
# model-drafter spec point both ways. Logs and JSON go to $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv,noheader
timeout 200 python3 -m pytest -q -x tests/test_graphs.py tests/test_graph_rows.py 2>&1 | tail -15 | tee "$OUT/gpu-tests.log"
for acc in 0.5 0.8; do
  for mode in no-chain chain; do
    flag=""; [ "$mode" = no-chain ] && flag="--no-chain"
    timeout 120 python3 -m bench.trace_spec_round --acceptance $acc $flag \
      --out "$OUT/trace-spec-round-$acc-$mode.json" > "$OUT/trace-$acc-$mode.log" 2>&1
    tail -3 "$OUT/trace-$acc-$mode.log"
    python3 -c "import json,sys; r=json.load(open(sys.argv[1])); d=r['drafted']; print(sys.argv[1], 'chained', r['chained'], 'round ms %.2f device %.2f propose host %.2f tok/s %.0f plain %.0f speedup %.2f' % (d['wall_ms_per_round'], d['device_ms_per_round'], d['drafter_host_ms_median'], d['tok_s'], r['plain']['tok_s'], r['speedup']))" "$OUT/trace-spec-round-$acc-$mode.json"
  done
done
for mode in no-chain chain; do
  flag=""; [ "$mode" = no-chain ] && flag="--no-chain"
  timeout 150 python3 -m bench.bench_engine --sections spec --accs 0.8 --ks 4 $flag \
    --out "$OUT/spec-8b-1b-$mode.json" > "$OUT/spec-$mode.log" 2>&1
  grep "^spec" "$OUT/spec-$mode.log" | tail -2
done
