#!/usr/bin/env bash
# H200 call 2: key partitions (split-KV decode with fixed bits), heads of 256 (Qwen3.5), the
# delta rule without fp fusion; before = HEAD 1142918 in .before/ (carried).
export PYTHONUNBUFFERED=1
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_graphs.py \
  tests/test_device_processing.py::test_a_row_processed_in_a_batch_has_its_bits_alone \
  "tests/test_device_processing.py::test_drafted_equals_undrafted_batched_on_the_device[penalties-seeded]" \
  tests/test_moe.py::test_on_the_triton_ops_experts_are_grouped_on_the_device \
  tests/test_hybrid.py::test_on_the_gpu_concurrent_equals_solo_and_drafted_equals_undrafted \
  tests/test_hybrid.py::test_on_the_triton_ops_the_delta_rule_kernel_keeps_the_equalities \
  2>&1 | tee $OUT/tests.log | grep -E "passed|failed|FAILED|Error" | tail -12
for tree in .before .; do
  (cd $tree && timeout 60 python3 -m bench.bench_attention --decode --lengths 512 2048 8192 32768 \
    --lanes 1 8 --out $OUT/attn-decode-$( [ $tree = . ] && echo after || echo before ).json 2>&1 | tail -16)
  (cd $tree && timeout 60 python3 -m bench.bench_attention --baseline --lengths 8192 32768 \
    --out $OUT/attn-prefill-$( [ $tree = . ] && echo after || echo before ).json 2>&1 | tail -3)
done
timeout 150 python3 -m bench.exactness --shape qwen3.5-2b-like --requests 8 --max-prompt 2048 \
  --out $OUT/exactness-qwen35-2b.json 2>&1 | grep -E "^(exact|fast)|Error|failed" | tail -8
timeout 200 python3 -m bench.exactness --shape llama-3.1-8b --requests 6 --max-prompt 4096 \
  --out $OUT/exactness-8b.json 2>&1 | grep -E "^(exact|fast)|Error|failed" | tail -8
timeout 120 python3 -m bench.bench_hybrid --shape qwen3.5-2b-like --repeats 2 2>&1 | tail -25 > $OUT/hybrid.log
tail -25 $OUT/hybrid.log
timeout 60 python3 -m bench.packed_gemv
timeout 90 ncu --clock-control none -k regex:_matmul_kernel -s 3 -c 1 --section SpeedOfLight \
  --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
  python3 -m bench.packed_gemv > $OUT/ncu-packed.txt 2>&1; grep -E "Duration|Throughput|Registers|Local|Achieved Occupancy|Stall|Block Size|Grid Size|Shared Memory" $OUT/ncu-packed.txt | head -40
