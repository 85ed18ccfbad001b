#!/usr/bin/env bash
# H200 call 1 (issue 19): the word-sliced packed kernel (kernels/packed_matmul.py). Old kernel
# (HEAD in .before/) and new tile variants at M = 1 on the 8B shapes, weights cycled past L2;
# bits of each variant against the default at M = 1, 37, 300; prefill at M = 2048; then 8B
# 4-bit vs bf16 decode with the sweep's best decode tiles; then the GPU kernel tests.
export PYTHONUNBUFFERED=1
(cd .before && PYTHONPATH=. timeout 70 python3 ../.exp/q4_sweep.py before 2>&1 | tail -1) | tee $OUT/before.log
PYTHONPATH=. timeout 250 python3 .exp/q4_sweep.py after $OUT/sweep.json > $OUT/sweep.log 2>&1; tail -5 $OUT/sweep.log
grep -A12 step_gemv $OUT/sweep.json; grep -A3 bits_differ $OUT/sweep.json | head -4
PYTHONPATH=. timeout 200 python3 .exp/bench_best.py $OUT/sweep.json --repeats 2 --new-tokens 128 --out $OUT/packed-8b.json 2>&1 | grep -v "^ " | tail -4
grep -A3 decode_tok_s $OUT/packed-8b.json; grep speedup $OUT/packed-8b.json
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "packed or reference" tests/test_gguf.py 2>&1 | tail -2
