#!/usr/bin/env bash
# H200 call 4: kernel-by-kernel profile (decode batch 1 both shapes, 8B 8K prefill) on the adopted
# kernels, then bench_speed with gpt-fast and transformers' SDPA prefill in the same run.
export PYTHONUNBUFFERED=1
timeout 110 python3 -m bench.profile_kernels --out $OUT/profile-kernels.json 2>&1 | grep -v warn | tail -3
timeout 440 python3 -m bench.bench_speed --peers .peers --hf 2>&1 | grep -v "^ \|^{\|^}" | tail -8
cp bench/results/speed-cuda.json $OUT/speed-cuda.json
