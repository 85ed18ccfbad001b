#!/usr/bin/env bash
# H200 call 10 (issue 18): exactness with the new next-turn check on the hybrid, under the GPU's
# default overlapped rounds (the check found, on the CPU with overlap forced on, that a round
# launched on top moved the state before the output snapshot was copied; fixed since).
export PYTHONUNBUFFERED=1
timeout 130 python3 -m bench.exactness --shape qwen3.5-2b-like --requests 4 --max-prompt 512 \
  --modes exact --out $OUT/exactness-qwen35-2b-turns.json 2>&1 | grep -E "^(exact|fast)|Error|failed" | tail -4
