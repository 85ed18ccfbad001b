#!/usr/bin/env bash
# H200 call 1 (eleventh session): the GPU code of the last two CPU-only sessions checked (MoE on
# CUDA graphs, grouped expert GEMMs, the delta-rule kernel, processing on the device), the hybrid
# and MoE figures of issue 18, decode-attention before split-KV (issue 17), the 4-bit profile (19).
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_graphs.py \
  tests/test_device_processing.py \
  tests/test_moe.py::test_on_the_triton_ops_experts_are_grouped_on_the_device \
  tests/test_hybrid.py::test_on_the_gpu_concurrent_equals_solo_and_drafted_equals_undrafted \
  tests/test_hybrid.py::test_on_the_triton_ops_the_delta_rule_kernel_keeps_the_equalities \
  2>&1 | tee $OUT/tests.log | tail -25
timeout 90 python3 -m bench.bench_attention --decode --lengths 512 2048 8192 32768 --lanes 1 8 \
  --out $OUT/attn-decode-before.json 2>&1 | tail -20
timeout 120 python3 -m bench.exactness --shape qwen3.5-2b-like --requests 8 --max-prompt 2048 \
  --out $OUT/exactness-qwen35-2b.json 2>&1 | tee $OUT/exactness.log | tail -12
timeout 150 python3 -m bench.exactness --shape qwen3-30b-a3b-like --requests 6 --max-prompt 1024 \
  --kv-gib 20 --out $OUT/exactness-qwen3-30b-a3b.json 2>&1 | tee -a $OUT/exactness.log | tail -12
timeout 150 python3 -m bench.bench_hybrid --shape qwen3.5-2b-like --repeats 2 2>&1 | tee $OUT/hybrid.log | tail -15
cp bench/results/hybrid-*.json $OUT/ 2>/dev/null
LANES_PDL=0 timeout 100 python3 -m bench.profile_kernels --bits 4 --shapes llama-3.1-8b --prefill 1024 \
  --steps 10 --out $OUT/profile-bits4.json 2>&1 | tail -30
