import time, statistics, torch, sys
torch.set_num_threads(int(sys.argv[1]))
from lanes.packed import PackedWeight
from lanes.kernels.packed_linear_cpu import packed_linear
g = torch.Generator().manual_seed(0)
def make(n, k, bits=4):
    codes = torch.randint(0, 2**32, (n, k*bits//32), generator=g, dtype=torch.int64).to(torch.uint32)
    return PackedWeight(codes, torch.rand((n, k//32), generator=g)*0.01, torch.randn((n, k//32), generator=g)*0.01, bits, 32)
w = make(3072, 576)
w8 = make(3072, 576, 8)
for m in (1, 2, 3, 4, 5, 8):
    x = torch.randn(m, 576)
    ts = []; ts8 = []
    for _ in range(200):
        t = time.perf_counter(); packed_linear(x, w); ts.append(time.perf_counter() - t)
        t = time.perf_counter(); packed_linear(x, w8); ts8.append(time.perf_counter() - t)
    med = statistics.median(ts); med8 = statistics.median(ts8)
    chunks = 3072 * 18 * m
    print(f"M={m}: 4-bit {med*1e6:.0f} us ({med/chunks*1e9*int(sys.argv[1]):.2f} ns per row-chunk per thread); 8-bit {med8*1e6:.0f} us")
