import time, statistics, torch
from lanes import EngineConfig, SamplingParams, build_engine
from lanes.batch import ForwardBatch
D = "drafter/weights/smollm2-135m-instruct+ngram"
eng = build_engine(None, EngineConfig(drafter=D))
runner = eng.runner
# time target forwards of n rows by timing decoder.forward calls inside a drafted generation
dec = runner.decoder
times = {}
orig = dec.forward
def timed(batch, *a, **k):
    t = time.perf_counter(); r = orig(batch, *a, **k); dt = time.perf_counter() - t
    times.setdefault(batch.num_tokens, []).append(dt)
    return r
dec.forward = timed
prop = eng.proposer
pt = []
orig_prop = prop.propose
def tprop(*a, **k):
    t = time.perf_counter(); r = orig_prop(*a, **k); pt.append((time.perf_counter() - t, sum(len(d.token_ids) for d in r))); return r
prop.propose = tprop
chats = [[{"role": "user", "content": c}] for c in ["Write a short poem about the sea.", "What is the capital of France? Answer in one sentence, then explain why.", "List five fruits."]]
p = SamplingParams(max_tokens=128, temperature=0.0)
eng.generate([chats[0]], p)
times.clear(); pt.clear()
t = time.perf_counter()
outs = [eng.generate([c], p)[0] for c in chats]
dt = time.perf_counter() - t
n = sum(len(o.token_ids) for o in outs)
print(f"{n/dt:.1f} tok/s; drafted {sum(o.num_drafted for o in outs)} accepted {sum(o.num_accepted for o in outs)}")
for rows, ts in sorted(times.items()):
    print(f"target forward rows={rows}: n={len(ts)} median {statistics.median(ts)*1e3:.2f} ms")
print(f"propose: n={len(pt)} median {statistics.median([x for x,_ in pt])*1e3:.2f} ms, drafts {statistics.median([d for _,d in pt])}")
print(f"total fwd {sum(sum(v) for v in times.values())*1e3:.0f} ms, propose {sum(x for x,_ in pt)*1e3:.0f} ms, wall {dt*1e3:.0f} ms")
