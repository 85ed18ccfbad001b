import time, collections, statistics
from bench.bench_cpu import prompts, SHIPPED_DRAFTER
from lanes import EngineConfig, SamplingParams, build_engine
chats = prompts(4)
eng = build_engine(None, EngineConfig(drafter=str(SHIPPED_DRAFTER), cost_aware_drafts=True))
prop = eng.proposer
acc = collections.Counter(); n = collections.Counter()
for name in ("propose", "prefill", "observe", "accepted"):
    f = getattr(prop, name)
    def w(*a, _f=f, _n=name, **k):
        t = time.perf_counter(); r = _f(*a, **k); acc[_n] += time.perf_counter() - t; n[_n] += 1; return r
    setattr(prop, name, w)
dec = eng.runner.decoder; orig = dec.forward; fw = collections.defaultdict(list)
def tf(b, *a):
    t = time.perf_counter(); r = orig(b, *a); fw[b.num_tokens].append(time.perf_counter() - t); return r
dec.forward = tf
eng.generate([chats[0]], SamplingParams(max_tokens=8))
for i in (0, 3):
    acc.clear(); n.clear(); fw.clear()
    t = time.perf_counter(); out = eng.generate([chats[i]], SamplingParams(max_tokens=128), cache_salt=str(i))[0]; dt = time.perf_counter() - t
    print(f"prompt {i}: {len(out.token_ids)/dt:.1f} tok/s, drafted {out.num_drafted} accepted {out.num_accepted}, wall {dt*1e3:.0f} ms")
    print("  drafter:", {k: f"{v*1e3:.0f} ms/{n[k]}" for k, v in acc.items()})
    print("  target forwards:", {k: f"{len(v)}x{statistics.median(v)*1e3:.1f}" for k, v in sorted(fw.items())})
