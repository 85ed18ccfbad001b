import statistics, sys
import lanes.drafter.eagle as eagle
from bench.bench_cpu import prompts, child_lanes, SHIPPED_DRAFTER
from lanes.models.resolve import default_gguf
gguf = str(default_gguf())
chats = prompts(4)
real = eagle._packs_own_linears
res = {"float head": [], "8-bit head": []}
for p in range(int(sys.argv[1])):
    for name in res:
        eagle._packs_own_linears = real if name == "8-bit head" else (lambda *a: False)
        runs = child_lanes(gguf, {"exact": True, "drafter": str(SHIPPED_DRAFTER)}, chats, 128)
        res[name] += [r["tokens"] / r["seconds"] for r in runs]
        print(p, name, [round(r["tokens"] / r["seconds"], 1) for r in runs], flush=True)
for name, v in res.items():
    print(f"{name:12s} median {statistics.median(v):.1f}")
