#!/usr/bin/env bash
# H200 call 17: the GPU tests on the final tree (device rounds graphed and eager, graphs,
# costs, device sampling).
export PYTHONUNBUFFERED=1
timeout 240 python3 -m pytest -q tests/test_device_rounds.py tests/test_graphs.py tests/test_draft_costs.py \
  "tests/test_kernels.py::test_device_sampling_keeps_the_equalities" 2>&1 | tail -3
