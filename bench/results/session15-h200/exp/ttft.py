"""8K prefill TTFT (8B shape, exact, one chunk) of the tree this runs in: medians of 5 after a
warm-up, as bench_speed's prefill_s."""
import json, statistics, sys
import torch
from bench.bench_speed import prefill_s
from bench.shapes import LLAMA_31_8B, random_checkpoint
from lanes import EngineConfig, build_engine
length = int(sys.argv[1]) if len(sys.argv) > 1 else 8192
cfg = EngineConfig(device="cuda", kv_cache_bytes=12 * 2**30, prompt_cache_bytes=0,
                   prefill_chunk=32768, max_tokens_per_round=32768)
e = build_engine(checkpoint=random_checkpoint(LLAMA_31_8B, "cuda"), config=cfg)
runs = [prefill_s(e, LLAMA_31_8B.vocab_size, length, 100 + i) for i in range(6)][1:]
print(json.dumps({"length": length, "median_s": statistics.median(runs), "runs": runs}))
