#!/usr/bin/env bash
# H200 call 6: the weight prefetch separated from programmatic dependent launch (LANES_PREFETCH),
# 8B shape, per-step wall and device time at 1 and 64 lanes.
export PYTHONUNBUFFERED=1
for cfg in "1 0" "1 1" "0 0" "1 0"; do
  set -- $cfg
  LANES_PDL=$1 LANES_PREFETCH=$2 timeout 70 python3 -m bench.profile_busy --overlap on --shapes llama-3.1-8b \
    --out $OUT/busy-pdl$1-prefetch$2.json 2>&1 | grep "lanes=" | python3 -c "
import json, sys
for line in sys.stdin:
    key, _, js = line.partition(' {')
    r = json.loads('{' + js)
    print('PDL=$1 PREFETCH=$2', key, 'wall %.3f ms device %.3f ms' % (r['wall_ms_per_step'], r['device_ms_per_step']))"
done
