#!/usr/bin/env bash
# H200 call 6: after penalties (host-sampled lanes beside device-sampled ones) and the metrics
# and endpoint changes: the GPU tests of graphs, device sampling, hybrids and penalties.
export PYTHONUNBUFFERED=1
timeout 300 python3 -m pytest -q tests/test_graphs.py tests/test_graph_rows.py \
  "tests/test_kernels.py::test_device_sampling_keeps_the_equalities" \
  "tests/test_hybrid.py::test_on_the_gpu_concurrent_equals_solo_and_drafted_equals_undrafted" \
  "tests/test_penalties.py::test_on_the_gpu_drafted_equals_undrafted_with_penalties" 2>&1 | tail -4
