#!/usr/bin/env bash
# H200 call 4 (issue 18): the 32K hybrid cancellation receipt (call 2's crashed printing a cancel
# that never fired: the prompt finished first); the 35B-A3B-like decode (call 3's engine asked
# more recurrent state than the default 512 MB KV budget holds).
export PYTHONUNBUFFERED=1
timeout 120 python3 -m bench.cancel_receipt --device cuda --shape qwen3.5-2b-like \
  --prompt-tokens 32768 --prefill-chunk 2048 --after 0.4 2>&1 | tail -6
cp bench/results/cancel-receipt-qwen3.5-2b-like-cuda.json $OUT/ 2>/dev/null
timeout 240 python3 -m bench.bench_hybrid --shape qwen3.5-35b-a3b-like --graphs both --repeats 2 \
  --prefill 2048 --new-tokens 128 --skip-hf --out $OUT/hybrid-35b.json > $OUT/hybrid-35b.log 2>&1
tail -24 $OUT/hybrid-35b.log
