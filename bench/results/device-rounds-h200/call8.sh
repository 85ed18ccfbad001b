#!/usr/bin/env bash
# H200 call 8: GPU tests after the device rounds' cost rule; the GGUF's first 49 MB (.gg3, with
# the gguf wheel) for call 9 (the tracked tree grew: the 45 + 53 MB split no longer fits).
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gg3/*.whl || exit 1
mkdir -p /root/keep/cache && cp .gg3/p1 /root/keep/ || exit 1
timeout 200 python3 -m pytest -q tests/test_device_rounds.py tests/test_graphs.py tests/test_draft_costs.py 2>&1 | tail -3
