#!/usr/bin/env bash
# H200 call 3: the GGUF's first part to /root/keep (for call 4), the gguf wheel; GPU tests of
# the chained drafter paths; bench.exactness in exact mode (a smaller run than the last one).
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /root/keep/cache && cp .gg1/part-aa /root/keep/ || exit 1
timeout 150 python3 -m pytest -q tests/test_graphs.py tests/test_graph_rows.py "tests/test_kernels.py::test_device_sampling_keeps_the_equalities" 2>&1 | tail -3
timeout 200 python3 -m bench.exactness --modes exact --requests 8 --max-prompt 1024 \
  --out $OUT/exactness-exact-8.json 2>&1 | tail -4
