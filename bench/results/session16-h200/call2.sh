#!/usr/bin/env bash
# H200 call 2 (issue 19): call 1's word-sliced kernel was 2-3x slower than the old tile. Now: the
# old tile's shape with codes read as bytes and nibbles interleaved in registers, one scale per
# row, and 4-bit codes turned into bf16 two at a time by packed arithmetic (inline PTX). Sweep of
# decode tiles at M = 1 (weights cycled past L2; bits against the default at M = 1, 37, 300),
# prefill at M = 2048; 8B 4-bit vs bf16 decode with the best decode tiles; exactness at 4 bits;
# the GPU kernel tests.
export PYTHONUNBUFFERED=1
PYTHONPATH=. timeout 200 python3 .exp/q4_sweep.py after $OUT/sweep.json > $OUT/sweep.log 2>&1; tail -3 $OUT/sweep.log
grep -A12 step_gemv $OUT/sweep.json; grep -A3 bits_differ $OUT/sweep.json | head -4
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "packed or reference" tests/test_gguf.py 2>&1 | tail -2
PYTHONPATH=. timeout 170 python3 .exp/bench_best.py $OUT/sweep.json --repeats 2 --new-tokens 128 --out $OUT/packed-8b.json 2>&1 | grep -v "^ " | tail -3
grep -A3 decode_tok_s $OUT/packed-8b.json; grep speedup $OUT/packed-8b.json
timeout 150 python3 -m bench.exactness --shape llama-3.1-8b --bits 4 --requests 6 --max-prompt 2048 \
  --modes exact --out $OUT/exactness-8b-q4.json 2>&1 | grep -E "^(exact|fast)|Error|failed|mismatch" | tail -4
