#!/usr/bin/env bash
# H200 call 3 (issue 19): call 2's kernel decodes 4-bit 8B at 235 tok/s (1.05x bf16) but rows
# of 37 and 300 differed from M = 1 (the 64/128-row tiles; the 16-row ones all agree). Which
# tiles for 17-64 rows and for prefill keep M = 1's bits on all five 8B weights (diagnostics:
# the fp32 route and the dense kernel at the same tiles), prefill speed of those that do; then
# 8B decode and exactness at 4 bits with the chosen tiles; the GPU kernel tests.
export PYTHONUNBUFFERED=1
PYTHONPATH=. timeout 220 python3 .exp/q4_tiles.py $OUT/tiles.json > $OUT/tiles.log 2>&1; grep -v "^ \|^{\|^}" $OUT/tiles.log | tail -30
PYTHONPATH=. timeout 160 python3 .exp/run_with_tiles.py $OUT/tiles.json bench.bench_packed --repeats 2 --new-tokens 128 --out $OUT/packed-8b.json 2>&1 | grep -v "^ " | tail -2
grep -A3 decode_tok_s $OUT/packed-8b.json; grep speedup $OUT/packed-8b.json
PYTHONPATH=. timeout 120 python3 .exp/run_with_tiles.py $OUT/tiles.json bench.exactness --shape llama-3.1-8b --bits 4 --requests 6 --max-prompt 2048 \
  --modes exact --out $OUT/exactness-8b-q4.json 2>&1 | grep -E "^(exact|fast|tiles)|Error|failed|mismatch" | tail -4
