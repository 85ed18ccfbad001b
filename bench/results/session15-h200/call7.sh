#!/usr/bin/env bash
# H200 call 7 (issue 18): where a hybrid's 8K prefill and graphed decode step spend device time
# (lanes' 8K prefill is behind transformers' torch reference on both hybrid shapes, calls 1, 6).
export PYTHONUNBUFFERED=1
LANES_PDL=0 timeout 400 python3 -m bench.profile_kernels --shapes qwen3.5-2b-like \
  qwen3.5-35b-a3b-like --prefill 8192 --steps 30 --out $OUT/profile-hybrids.json 2>&1 | tail -8
