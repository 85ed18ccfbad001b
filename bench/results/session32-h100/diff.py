"""cProfile of drafted vs plain runs at one concurrency on one engine: per-function call and
tottime differences (the drafted run's extra host work). argv: model device concurrency prompts"""
import cProfile, pstats, dataclasses, sys, time
from bench.drafters.concurrency import everyday, run_groups, SHIPPED
from lanes import EngineConfig, SamplingParams, build_engine
model, device, c, n, drafter = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
engine = build_engine(model, EngineConfig(device=device, drafter=drafter))
chats = everyday(n)
d = SamplingParams(max_tokens=96, ignore_eos=True); p = dataclasses.replace(d, draft=False)
for _ in range(2):
    run_groups(engine, chats, c, d); run_groups(engine, chats, c, p)
for name, params in (("d", d), ("p", p), ("d", d), ("p", p)):
    t0 = time.perf_counter(); run_groups(engine, chats, c, params)
    print("unprofiled", name, round(time.perf_counter() - t0, 4))
res = {}
for name, params in (("d", d), ("p", p)):
    r0 = engine.metrics.num_rounds; v0 = engine.metrics.num_verify_steps
    pr = cProfile.Profile(); t0 = time.perf_counter(); pr.enable(); run_groups(engine, chats, c, params); pr.disable()
    print(name, "seconds", round(time.perf_counter() - t0, 4), "rounds", engine.metrics.num_rounds - r0, "verifies", engine.metrics.num_verify_steps - v0)
    st = pstats.Stats(pr).stats
    res[name] = {f"{k[0].split('/lanes/')[-1][-40:]}:{k[1]}:{k[2]}": (v[1], v[2]) for k, v in st.items()}
diff = []
for k in set(res["d"]) | set(res["p"]):
    a = res["d"].get(k, (0, 0)); b = res["p"].get(k, (0, 0))
    diff.append((a[0] - b[0], a[1] - b[1], k))
print("by tottime"); diff.sort(key=lambda x: -x[1])
for n_, t, k in diff[:40]: print(f"{n_:7d} {t*1e3:8.2f}ms {k}")
print("by calls"); diff.sort(key=lambda x: -x[0])
for n_, t, k in diff[:30]: print(f"{n_:7d} {t*1e3:8.2f}ms {k}")
