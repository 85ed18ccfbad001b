#!/usr/bin/env bash
# H200 call 5: the matmul kernels' shared epilogue (split_plan.finish_tile) on the GPU: the
# kernel tests (rows independent of M for float and packed weights, the registry's references).
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "matmul or packed or reference" 2>&1 | tail -3
