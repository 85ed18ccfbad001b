#!/usr/bin/env bash
# H200 call 9 (issue 19): packed codes turned into fp32 by the 2**23 trick (an OR and an exact
# subtraction) instead of an int -> float conversion; before = HEAD in .before/ (carried). GEMV
# times at M = 1, bits compared between the trees at M = 1, 5, 64, 300; then 4-bit 8B decode.
export PYTHONUNBUFFERED=1
(cd .before && PYTHONPATH=. timeout 90 python3 ../.exp/packed_magic.py before $OUT/before.pt 2>&1 | tail -1)
PYTHONPATH=. timeout 90 python3 .exp/packed_magic.py after $OUT/after.pt 2>&1 | tail -1
python3 .exp/compare_saved.py $OUT/before.pt $OUT/after.pt; rm -f $OUT/*.pt
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "packed or reference" 2>&1 | tail -2
timeout 200 python3 -m bench.bench_packed --repeats 2 --new-tokens 128 --out $OUT/packed-8b.json 2>&1 | tail -12
