"""Session 15: the packed GEMV with codes turned into fp32 by the 2**23 trick instead of an int ->
float conversion. Run from each tree (before / after): times graph replays at M = 1 and saves
outputs at M = 1, 5, 64, 300 for a bitwise comparison between the trees."""

import json
import sys

import torch

from bench.bench_matmul import graph_us
from lanes.kernels import matmul
from lanes.packed import PackedWeight

tag, path = sys.argv[1], sys.argv[2]
saved, times = {}, {}
for bits in (4, 8):
    for n, k in ((6144, 4096), (28672, 4096), (4096, 14336)):
        gen = torch.Generator(device="cuda").manual_seed(n + k + bits)
        codes = torch.randint(
            -(2**31), 2**31 - 1, (n, k * bits // 32), generator=gen, device="cuda", dtype=torch.int32
        )
        scales = torch.rand((n, k // 64), generator=gen, device="cuda").to(torch.bfloat16) * 0.01
        w = PackedWeight(codes.view(torch.uint32), scales, -7.5 * scales, bits, 64)
        x = torch.randn((300, k), generator=gen, device="cuda", dtype=torch.bfloat16)
        key = f"{bits}bit {n}x{k}"
        for m in (1, 5, 64, 300):
            saved[f"{key} m{m}"] = matmul.matmul(x[:m], w).cpu()
        times[key] = round(graph_us(lambda w=w, x=x: matmul.matmul(x[:1], w)), 2)
        print(tag, key, times[key], "us", flush=True)
torch.save(saved, path)
print(json.dumps({tag: times}))
