# call 2: item 7 (chunks without full synchronizes, rounds timed by CUDA events): GPU tests,
# c64 before (.before = 72a5c5b) / after at share 0.5, after at share 1.0, the 8B cancel receipt
export PYTHONUNBUFFERED=1
timeout 200 python -m pytest -q -x tests/test_round_clock.py tests/test_launched_chunks.py \
  tests/test_cancel.py tests/test_overlap.py tests/test_graphs.py -k "not server" > $OUT/tests.log 2>&1
tail -3 $OUT/tests.log
(cd .before && PYTHONPATH=. timeout 120 python ../bench/c64_rounds.py --runs 3 --seeded-runs 0 --out $OUT/c64-before.json 2>&1 | grep "^run")
timeout 120 python -m bench.c64_rounds --runs 3 --seeded-runs 0 --out $OUT/c64-after.json 2>&1 | grep "^run"
timeout 120 python -m bench.c64_rounds --runs 3 --seeded-runs 0 --prefill-share 1.0 --out $OUT/c64-after-share1.json 2>&1 | grep "^run"
timeout 150 python -m bench.cancel_receipt --device cuda --shape llama-3.1-8b --prompt-tokens 32768 --prefill-chunk 2048 2>&1 | tail -5
cp bench/results/cancel-receipt-llama-3.1-8b-cuda.json $OUT/
