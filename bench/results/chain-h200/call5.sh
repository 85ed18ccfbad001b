#!/usr/bin/env bash
# H200 call 5: after the hybrid (Qwen3.5) work changed the decoder's attention path and the
# runner: the GPU tests again, the hybrid equalities on CUDA, bench.exactness in exact mode.
export PYTHONUNBUFFERED=1
timeout 240 python3 -m pytest -q tests/test_graphs.py tests/test_graph_rows.py \
  "tests/test_kernels.py::test_device_sampling_keeps_the_equalities" \
  "tests/test_hybrid.py::test_on_the_gpu_concurrent_equals_solo_and_drafted_equals_undrafted" 2>&1 | tail -4
timeout 200 python3 -m bench.exactness --modes exact --requests 8 --max-prompt 1024 \
  --out $OUT/exactness-exact-8.json 2>&1 | tail -3
