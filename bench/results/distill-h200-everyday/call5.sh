# H200 call 5 (second lease): the GGUF's first part to /root/keep; GPU tests of the draft paths.
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /root/keep/cache && cp .gg1/part-aa /root/keep/ || exit 1
timeout 150 python3 -m pytest -q tests/test_graphs.py "tests/test_kernels.py::test_device_sampling_keeps_the_equalities" 2>&1 | tail -2
