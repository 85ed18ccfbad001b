#!/usr/bin/env bash
# H200 call 5: the Triton engine-vs-transformers test on the old tree (.before = 9973898: did it
# fail on the GPU before this change?), bench_engine c64 after and before, bench.exactness.
export PYTHONUNBUFFERED=1
(cd .before && timeout 60 python3 -m pytest -q -x tests/test_kernels.py -k engine_on_triton 2>&1 | grep -E "^E |passed|failed" | head -8)
for tree in after before; do
  dir=.; [ $tree = before ] && dir=.before
  (cd $dir && timeout 150 python3 -m bench.bench_engine --sections c64 --out $OUT/engine-c64-$tree.json 2>&1 | grep "^c64" | sed "s/^/$tree /")
done
timeout 240 python3 -m bench.exactness --modes exact,fast --requests 8 --max-prompt 1024 \
  --out $OUT/exactness-exact-fast-8.json 2>&1 | tail -8
