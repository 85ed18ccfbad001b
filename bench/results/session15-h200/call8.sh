#!/usr/bin/env bash
# H200 call 8 (issue 18): the delta-rule kernel's 8K-row prefill by value-column block and warps
# (call 7: 262 of a 323 ms 8K prefill is that kernel, 64 programs on 132 SMs).
export PYTHONUNBUFFERED=1
timeout 200 python3 .exp/delta_blocks.py 8192 2>&1 | tail -12 | tee $OUT/delta-blocks.log
