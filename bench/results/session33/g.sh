#!/usr/bin/env bash
# session 33 (issue 45 item 1): the chunked gated delta rule on a GPU. One layer's time against
# the recurrent kernel and flash-linear-attention 0.6.0 (wheels carried in .whl), the bits across
# splits on the device; the tests natively; then the Qwen3.5-2B-like 8K prefill both ways.
export PYTHONUNBUFFERED=1
# flash-linear-attention only for the layer bench: installed for the tests, transformers' CPU
# reference model would take its GPU kernels
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
nvidia-smi --query-gpu=name --format=csv > $OUT/gpu.txt
PYTHONPATH=/tmp/site timeout 150 python3 -m bench.kernels delta-layer --out $OUT/delta-layer-2b.json 2>&1 | tail -20
PYTHONPATH=/tmp/site timeout 90 python3 -m bench.kernels delta-layer --shape qwen3.5-35b-a3b-like --tokens 2048,8192 \
  --out $OUT/delta-layer-35b.json 2>&1 | tail -8
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_chunked_delta.py \
  tests/test_chunked_hybrid.py "tests/test_kernels.py::test_kernel_matches_reference[chunked_gated_delta]" \
  > $OUT/tests.log 2>&1; tail -15 $OUT/tests.log
timeout 170 python3 -m bench.speed.hybrid --prefill 8192 --new-tokens 64 --repeats 2 --skip-hf \
  --graphs on --delta-rule both --out $OUT/hybrid-2b-8k.json 2>&1 | tail -30
