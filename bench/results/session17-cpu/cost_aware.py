import statistics, sys, time
from bench.bench_cpu import prompts, child_lanes, SHIPPED_DRAFTER
from lanes.models.resolve import default_gguf
gguf = str(default_gguf())
chats = prompts(4)
configs = {
    "exact": {"exact": True},
    "drafter": {"exact": True, "drafter": str(SHIPPED_DRAFTER)},
    "drafter cost-aware": {"exact": True, "drafter": str(SHIPPED_DRAFTER), "cost_aware_drafts": True},
}
res = {k: [] for k in configs}
for p in range(int(sys.argv[1]) if len(sys.argv) > 1 else 2):
    for name, cfg in configs.items():
        runs = child_lanes(gguf, cfg, chats, 128)
        res[name] += [r["tokens"] / r["seconds"] for r in runs]
        print(p, name, [round(r["tokens"] / r["seconds"], 1) for r in runs], flush=True)
for name, v in res.items():
    print(f"{name:20s} median {statistics.median(v):.1f}")
