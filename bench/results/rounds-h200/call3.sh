# call 3: item 2 (LaneRows at the runner's door, runner-owned block tables) on top of item 7:
# GPU tests, bench.exactness (8B), steady-decode busy profile before (.before = 72a5c5b) / after
export PYTHONUNBUFFERED=1
timeout 240 python -m pytest -q -p no:cacheprovider tests/test_graphs.py tests/test_device_rounds.py \
  tests/test_overlap.py tests/test_block_tables.py tests/test_launched_chunks.py tests/test_round_clock.py \
  tests/test_graph_rows.py tests/test_cancel.py tests/test_hybrid.py tests/test_kernels.py \
  -k "not server" > $OUT/gpu-tests.log 2>&1
tail -3 $OUT/gpu-tests.log
timeout 170 python -m bench.exactness --modes exact,fast --requests 8 --max-prompt 1024 \
  --out $OUT/exactness.json > $OUT/exactness.log 2>&1; tail -4 $OUT/exactness.log
for tree in before after; do
  if [ $tree = before ]; then cd .before; else cd $OLDPWD; fi
  timeout 100 python -m bench.profile_busy --overlap on --out $OUT/busy-$tree.json 2>&1 | grep lanes=
done
