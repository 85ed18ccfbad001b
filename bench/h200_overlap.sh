#!/usr/bin/env bash
# One H200 call for overlapped rounds (issue 15): GPU tests, on/off speed with equal outputs,
# GPU busy share, exactness in exact mode. Logs and JSON go to $OUT (the device tool's folder).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -c "import lanes, lanes.kernels.sampling, lanes.drafter; print('imports ok', lanes.kernels.__file__)"
nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv,noheader
python3 -m pytest -q -x tests/test_graphs.py 2>&1 | tail -5 | tee "$OUT/gpu-tests.log"
python3 -m bench.bench_overlap --out "$OUT/overlap-h200.json" 2>&1 | tee "$OUT/overlap.log"
python3 -m bench.profile_busy --out "$OUT/busy-h200-overlap.json" 2>&1 | tee "$OUT/busy.log"
python3 -m bench.exactness --modes exact --out "$OUT/exactness-overlap.json" 2>&1 | tail -8 | tee "$OUT/exactness.log"
