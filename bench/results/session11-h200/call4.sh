#!/usr/bin/env bash
# H200 call 4: the 4-bit tile loaded word by word (issue 19): bits, GEMV speed, 8B decode.
export PYTHONUNBUFFERED=1
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "packed" 2>&1 | tail -3
timeout 40 python3 -m bench.packed_gemv; timeout 30 python3 -m bench.packed_gemv --n 28672 --k 4096
timeout 200 python3 -m bench.bench_packed --repeats 2 --new-tokens 128 --out $OUT/packed-8b.json 2>&1 | tail -6
timeout 100 python3 -m bench.exactness --shape llama-3.2-1b --bits 4 --requests 4 --max-prompt 1024 \
  --modes exact --out $OUT/exactness-1b-4bit.json 2>&1 | grep -E "^(exact|fast)|Error|failed" | tail -4
