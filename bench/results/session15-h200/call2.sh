#!/usr/bin/env bash
# H200 call 2 (issue 18): the 32K hybrid cancellation receipt; fast-mode controls (the harness
# now compares logprobs too) for the hybrid and the Qwen3-MoE shape; the MoE shape graphed.
export PYTHONUNBUFFERED=1
timeout 150 python3 -m bench.cancel_receipt --device cuda --shape qwen3.5-2b-like \
  --prompt-tokens 32768 --prefill-chunk 2048 --after 1.0 2>&1 | tail -8
cp bench/results/cancel-receipt-cuda.json $OUT/cancel-receipt-qwen35-2b.json 2>/dev/null
timeout 110 python3 -m bench.exactness --shape qwen3.5-2b-like --requests 6 --max-prompt 256 \
  --modes fast --out $OUT/exactness-qwen35-2b-fast.json 2>&1 | grep -E "^(exact|fast)|Error|failed" | tail -8
timeout 220 python3 -m bench.exactness --shape qwen3-30b-a3b-like --requests 6 --max-prompt 1024 \
  --out $OUT/exactness-qwen3-30b.json 2>&1 | grep -E "^(exact|fast)|Error|failed" | tail -8
