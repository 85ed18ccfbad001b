#!/usr/bin/env bash
# H200 call 4 (twelfth session, short): the packed GGUF (issue 19 item 2) through the Triton ops
# on the GPU (groups of 32 at 4 and 8 bits), and the packed dequantize that unpacks bytes (the
# packed embedding's lookups run it on the GPU). gguf is not in the image: its wheel is carried.
export PYTHONUNBUFFERED=1
pip install -q --no-deps --target /tmp/site .whl/gguf-*.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/site
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_gguf.py -k "packed or affine" \
  "tests/test_kernels.py::test_packed_matmul_rows_do_not_depend_on_m" 2>&1 | tee $OUT/tests.log \
  | grep -E "passed|failed|FAILED|Error" | tail -8
