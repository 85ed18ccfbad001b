#!/usr/bin/env bash
# H200 call 1 (ninth session, issue 17 prefill): GPU kernel tests on the new attention/matmul,
# the prefill GEMM tiles with the segment loop flattened, the prefill attention layouts against
# SDPA (new tree) and the old kernel (.before), kernel-by-kernel profiles of decode and an 8K
# prefill on the old and new trees.
export PYTHONUNBUFFERED=1
timeout 150 python3 -m pytest -q tests/test_kernels.py 2>&1 | tail -3
timeout 120 python3 -m bench.bench_prefill_tiles --out $OUT/prefill-tiles.json 2>&1 | tail -5
timeout 120 python3 -m bench.bench_attention --out $OUT/attention.json 2>&1 | tail -3
(cd .before && cp ../bench/bench_attention.py bench/ && timeout 90 python3 -m bench.bench_attention --baseline --out $OUT/attention-before.json 2>&1 | tail -3)
(cd .before && timeout 150 python3 -m bench.profile_kernels --out $OUT/profile-before.json 2>&1 | tail -4)
timeout 150 python3 -m bench.profile_kernels --out $OUT/profile-after.json 2>&1 | tail -4
