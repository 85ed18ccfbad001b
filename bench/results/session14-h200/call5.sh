#!/usr/bin/env bash
# H200 call 5 (fourteenth session, the last device minutes): call 2's bench_speed ran out of time
# before gpt-fast; here lanes' 8B batch-1 exact decode (as bench_speed) and gpt-fast's, same call.
export PYTHONUNBUFFERED=1
PYTHONPATH=. timeout 60 python3 .exp/decode8b.py 2>&1 | tail -1 | tee $OUT/lanes-8b.json
timeout 140 python3 .peers/run_gptfast.py llama-3.1-8b --new 256 2>&1 | grep '^{' | tee $OUT/gptfast-8b.json
