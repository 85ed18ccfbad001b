"""8B batch-1 exact decode tok/s (bench_speed's decode_tok_s: 128-token prompt, 256 new), a
warm-up then 3 runs, for a same-call ratio against gpt-fast."""
import json, statistics
from bench.bench_speed import decode_tok_s
from bench.shapes import LLAMA_31_8B, random_checkpoint
from lanes import EngineConfig, build_engine
cfg = EngineConfig(device="cuda", kv_cache_bytes=12 * 2**30, prompt_cache_bytes=0)
e = build_engine(checkpoint=random_checkpoint(LLAMA_31_8B, "cuda"), config=cfg)
runs = [decode_tok_s(e, LLAMA_31_8B.vocab_size, 256, i) for i in range(4)][1:]
print(json.dumps({"shape": "llama-3.1-8b", "lanes_exact_tok_s": statistics.median(runs), "runs": runs}))
