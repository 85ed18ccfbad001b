#!/usr/bin/env bash
# H200 call 4 (issue 19): call 3's tile rule adopted as the defaults (decode 16 rows, 17-64 rows
# in 32-row tiles, prefill 128 x 32 weight-left in 2 warps: no warpgroup MMA). GPU kernel tests
# (rows at M = 1 / 37 / 300 on a 512 x 4096 weight, the warpgroup negative control), then 8B
# 4-bit vs bf16 decode and exactness at 4 bits with no monkeypatching.
export PYTHONUNBUFFERED=1
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "packed or reference" tests/test_gguf.py 2>&1 | tail -3
timeout 160 python3 -m bench.bench_packed --repeats 3 --new-tokens 128 --out $OUT/packed-8b.json 2>&1 | grep -v "^ " | tail -2
grep -A3 decode_tok_s $OUT/packed-8b.json; grep -A3 weight_bytes $OUT/packed-8b.json; grep speedup $OUT/packed-8b.json
timeout 120 python3 -m bench.exactness --shape llama-3.1-8b --bits 4 --requests 6 --max-prompt 2048 \
  --modes exact,fast --out $OUT/exactness-8b-q4.json 2>&1 | grep -E "^(exact|fast)|Error|failed" | tail -4
