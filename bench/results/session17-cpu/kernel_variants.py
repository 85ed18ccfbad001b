import sys, time, ctypes, statistics, torch
from pathlib import Path
import lanes.kernels.native as native
import lanes.kernels.packed_linear_cpu as plc
from lanes.packed import PackedWeight
torch.set_num_threads(2)
variants = sys.argv[1:]
fns = {}
for v in variants:
    native.SOURCES = Path(v)
    native.load.cache_clear(); plc._kernel.cache_clear()
    fns[v] = plc._kernel()
g = torch.Generator().manual_seed(0)
def make(n, k):
    codes = torch.randint(0, 2**32, (n, k*4//32), generator=g, dtype=torch.int64).to(torch.uint32)
    return PackedWeight(codes, torch.rand((n, k//32), generator=g)*0.01, torch.randn((n, k//32), generator=g)*0.01, 4, 32)
ws = []
for _ in range(30):
    ws += [make(960,576), make(576,576), make(3072,576), make(576,1536)]
ws.append(make(49152, 576))
nbytes = sum(w.nbytes for w in ws)
def run(fn, m):
    xs = {576: torch.randn(m,576), 1536: torch.randn(m,1536)}
    t = time.perf_counter()
    for w in ws:
        plc._kernel = lambda: fn
        plc.packed_linear(xs[w.shape[1]], w)
    return time.perf_counter() - t
for m in (1, 5):
    times = {v: [] for v in variants}
    for rep in range(15):
        for v in variants:
            times[v].append(run(fns[v], m))
    for v in variants:
        med = statistics.median(times[v])
        print(f"M={m} {v:12s} median {med*1e3:.2f} ms  ({nbytes/med/1e9:.1f} GB/s)  min {min(times[v])*1e3:.2f}")
