#!/usr/bin/env bash
# H200 call 5: the decode GEMV's programs ask their first weight blocks into L2 before waiting
# (under programmatic dependent launch). Exactness on it; then per-step wall and device time with
# programmatic dependent launch off (LANES_PDL=0, no prefetch either) and on, same tree, same
# call; drafted device rounds (SmolLM2 shape, shipped head, acceptance 0.8) with it on.
export PYTHONUNBUFFERED=1
timeout 100 python3 -m bench.exactness --modes exact --requests 8 --max-prompt 2048 \
  --out $OUT/exactness-exact-8.json 2>&1 | grep "^exact"
for pdl in 0 1; do
  LANES_PDL=$pdl timeout 100 python3 -m bench.profile_busy --overlap on --out $OUT/busy-pdl$pdl.json 2>&1 \
    | grep "lanes=" | python3 -c "
import json, sys
for line in sys.stdin:
    key, _, js = line.partition(' {')
    r = json.loads('{' + js)
    print('PDL=$pdl', key, 'wall %.3f ms device %.3f ms events %.0f' % (r['wall_ms_per_step'], r['device_ms_per_step'], r['device_events_per_step']))"
done
timeout 120 python3 -m bench.bench_device_rounds --acceptance 0.8 --lanes 1,4 --new 256 --repeats 3 \
  --out $OUT/device-rounds.json > /dev/null 2>&1
python3 - $OUT/device-rounds.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["rows"]:
    print(r["lanes"], "plain", round(r["plain"]["decode_tok_s_per_lane"]), "device rounds",
          round(r["device_rounds"]["decode_tok_s_per_lane"]), "equal", r["device_rounds"]["outputs_equal_plain"])
PY
