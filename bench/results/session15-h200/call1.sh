#!/usr/bin/env bash
# H200 call 1 (issue 18): hybrids under CUDA graphs. GPU tests of the lanes form of the delta
# rule and of graphed hybrid decode/verify (equal to eager, bitwise); Qwen3.5-2B-like decode and
# 8K prefill with graphs off and on (transformers beside); exactness in exact mode.
export PYTHONUNBUFFERED=1
timeout 240 python3 -m pytest -q -p no:cacheprovider \
  tests/test_kernels.py::test_kernel_matches_reference \
  tests/test_kernels.py::test_gated_delta_rows_do_not_depend_on_the_split \
  tests/test_kernels.py::test_gated_delta_lanes_give_each_lane_its_own_bits \
  tests/test_hybrid.py::test_on_the_gpu_concurrent_equals_solo_and_drafted_equals_undrafted \
  tests/test_hybrid.py::test_on_the_triton_ops_the_delta_rule_kernel_keeps_the_equalities \
  tests/test_hybrid.py::test_graph_buckets_give_the_eager_bits \
  tests/test_graphs.py \
  2>&1 | tee $OUT/tests.log | grep -E "passed|failed|FAILED|Error" | tail -12
timeout 200 python3 -m bench.bench_hybrid --shape qwen3.5-2b-like --graphs both --repeats 2 \
  --out $OUT/hybrid-2b.json > $OUT/hybrid-2b.log 2>&1; tail -30 $OUT/hybrid-2b.log
timeout 140 python3 -m bench.exactness --shape qwen3.5-2b-like --requests 8 --max-prompt 2048 \
  --modes exact --out $OUT/exactness-qwen35-2b.json 2>&1 | grep -E "^(exact|fast)|Error|failed" | tail -8
