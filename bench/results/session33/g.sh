#!/usr/bin/env bash
# session 33 (issue 45 item 1), not run: no device was lent. The chunked gated delta rule on a
# GPU: its tests natively (bits across splits, the model-level equalities with 16-row chunks),
# one layer's time against the recurrent kernel (and flash-linear-attention if its wheel is
# carried and installed first), then the Qwen3.5-2B-like 8K prefill both ways in one engine run.
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv > $OUT/gpu.txt
timeout 240 python -m pytest -q -p no:cacheprovider tests/test_chunked_delta.py \
  tests/test_chunked_hybrid.py "tests/test_kernels.py::test_kernel_matches_reference[chunked_gated_delta]" \
  > $OUT/tests.log 2>&1; tail -3 $OUT/tests.log
timeout 120 python -m bench.kernels delta-layer --out $OUT/delta-layer-2b.json
timeout 90 python -m bench.kernels delta-layer --shape qwen3.5-35b-a3b-like --tokens 2048,8192 \
  --out $OUT/delta-layer-35b.json
timeout 150 python -m bench.speed.hybrid --prefill 8192 --new-tokens 64 --repeats 2 --skip-hf \
  --graphs on --delta-rule both --out $OUT/hybrid-2b-8k.json | tail -30
