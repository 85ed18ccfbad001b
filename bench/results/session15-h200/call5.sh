#!/usr/bin/env bash
# H200 call 5 (issue 18): the 35B-A3B-like shape beside transformers' Qwen3_5MoeForCausalLM
# (random weights of the same shape, no flash-linear-attention on the machine), graphs on.
export PYTHONUNBUFFERED=1
timeout 420 python3 -m bench.bench_hybrid --shape qwen3.5-35b-a3b-like --graphs on --repeats 1 \
  --prefill 2048 --new-tokens 32 --out $OUT/hybrid-35b-hf.json > $OUT/hybrid-35b-hf.log 2>&1
grep -v "^\[transformers\]" $OUT/hybrid-35b-hf.log | tail -30
