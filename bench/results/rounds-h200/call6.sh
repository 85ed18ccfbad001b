# call 6 (issue 19 item 4): 4-bit MLX-style codes served packed by the Triton kernel (TritonOps.linear
# no longer dequantizes float tiles): bs1 decode bf16 vs 4-bit on the 8B and SmolLM2 shapes, alternating;
# bench.exactness exact mode on the 4-bit 8B shape
export PYTHONUNBUFFERED=1
timeout 200 python -m bench.bench_packed --shape llama-3.1-8b --out $OUT/packed-8b.json 2>&1 | grep -A3 '"decode_tok_s"\|speedup\|weight_bytes\|Error'
timeout 100 python -m bench.bench_packed --shape smollm2-135m --out $OUT/packed-smollm2.json 2>&1 | grep -A3 '"decode_tok_s"\|speedup\|weight_bytes\|Error'
timeout 200 python -m bench.exactness --modes exact --requests 8 --max-prompt 1024 --bits 4 \
  --out $OUT/exactness-4bit.json > $OUT/exactness-4bit.log 2>&1; tail -3 $OUT/exactness-4bit.log
