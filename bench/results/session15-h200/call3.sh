#!/usr/bin/env bash
# H200 call 3 (issue 18): the Qwen3.5-35B-A3B-like hybrid MoE: decode and 2K prefill with graphs
# off and on, then exactness (exact and fast) on the same shape.
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=memory.used,memory.total --format=csv
timeout 250 python3 -m bench.bench_hybrid --shape qwen3.5-35b-a3b-like --graphs both --repeats 2 \
  --prefill 2048 --new-tokens 128 --skip-hf --out $OUT/hybrid-35b.json > $OUT/hybrid-35b.log 2>&1
tail -30 $OUT/hybrid-35b.log
timeout 300 python3 -m bench.exactness --shape qwen3.5-35b-a3b-like --requests 6 --max-prompt 1024 \
  --out $OUT/exactness-qwen35-35b.json 2>&1 | grep -E "^(exact|fast)|Error|failed" | tail -8
