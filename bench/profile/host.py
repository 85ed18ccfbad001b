"""Host time of decode rounds with many lanes, on a tiny random model (the forward is cheap, so
the engine's own Python shows): `python -m bench.profile.host [--exact] [--lanes 64]`.

Prints ms per round and the cProfile top 25 by cumulative time.
"""

import argparse
import cProfile
import pstats
import time

from bench.shapes import SHAPES, id_tokenizer, random_checkpoint, synthetic_prompt
from lanes import EngineConfig, SamplingParams, build_engine

ap = argparse.ArgumentParser()
ap.add_argument("--exact", action="store_true", help="exact (batch-invariant) ops; default fast")
ap.add_argument("--lanes", type=int, default=64)
args = ap.parse_args()
shape = SHAPES["tiny"]
ck = random_checkpoint(shape, "cpu", tokenizer=id_tokenizer(shape.vocab_size))
eng = build_engine(
    checkpoint=ck, config=EngineConfig(max_lanes=args.lanes, prompt_cache_bytes=0, exact=args.exact)
)
prompts = [synthetic_prompt(shape.vocab_size, 512, i) for i in range(args.lanes)]
params = SamplingParams(max_tokens=64, ignore_eos=True)
eng.generate(prompts[:2], params)
for p in prompts:
    eng.submit(p, params)
# run prefill rounds first
while any(x.num_computed < len(x.prompt_ids) for x in eng.running + list(eng.waiting)):
    eng.step()
pr = cProfile.Profile()
t = time.perf_counter()
n = 0
pr.enable()
while eng.has_work():
    eng.step()
    n += 1
pr.disable()
print(
    f"{n} decode rounds, {(time.perf_counter() - t) / n * 1e3:.2f} ms per round ({args.lanes} lanes)"
)
pstats.Stats(pr).sort_stats("cumulative").print_stats(25)
