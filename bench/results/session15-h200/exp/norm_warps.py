"""add_rms_norm with 4 / 8 / 16 warps: one row (graph replays) and 8K rows, D = 4096 and 576."""
import torch, triton
from bench.bench_matmul import event_us, graph_us
from lanes.kernels import rmsnorm
from lanes.kernels.common import pdl_launch

def run(x, r, w, warps):
    m, d = x.shape
    out = torch.empty_like(x); summed = torch.empty_like(x)
    rmsnorm._add_rms_norm_kernel[(m,)](x, r, w, out, summed, d, 1e-5, HAS_RES=True,
        BLOCK=triton.next_power_of_2(d), PDL=False, num_warps=warps)
    return summed, out

for d in (4096, 576):
    for m in (1, 64, 8192):
        x = torch.randn((m, d), device="cuda", dtype=torch.bfloat16)
        r = torch.randn((m, d), device="cuda", dtype=torch.bfloat16)
        w = torch.randn((d,), device="cuda", dtype=torch.bfloat16)
        row = []
        for warps in (4, 8, 16):
            us = graph_us(lambda: run(x, r, w, warps)) if m <= 64 else event_us(lambda: run(x, r, w, warps), 9)
            row.append(f"w{warps} {us:.2f}us {m * d * 2 * 4 / us / 1e6:.2f}TB/s")
        print(f"D={d} M={m}:", " | ".join(row), flush=True)
