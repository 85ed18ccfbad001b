"""Decode GEMV (M = 1) of the 8B weights: pipeline stages, warps and BLOCK_K 128 against the
engine's launch, four weight copies cycled in one graph (more than L2), us per call and TB/s;
BLOCK_K 128's bits against the engine's."""
import torch, triton
from bench.bench_matmul import event_us
from lanes.kernels import matmul
from lanes.kernels.common import tickets

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
          "lm_head": (128256, 4096)}


def gemv(x, w, stages=None, warps=None, block_k=64):
    m, k = x.shape
    n = w.shape[0]
    plan = matmul.plan_for(n, k, matmul.target_programs(x.device))
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    partial = plan.split > 1
    grid_mn = (triton.cdiv(m, 16), triton.cdiv(n, plan.block_n))
    counters = tickets(x.device, grid_mn[0] * grid_mn[1], "matmul")
    parts = torch.empty((plan.split, m, n), dtype=torch.float32, device=x.device) if partial else out
    launch = {}
    if stages: launch["num_stages"] = stages
    if warps: launch["num_warps"] = warps
    matmul._matmul_kernel[(*grid_mn, plan.split) if partial else grid_mn](
        x, w, out, out, out, out, parts, counters, m, n, k, x.stride(0), w.stride(0), 0,
        SEG_K=k // plan.split, SPLIT=plan.split, PARTIAL=partial, HAS_BIAS=False, UPCAST=False,
        ROW_STABLE=False, PACKED=False, BITS=0, GROUP=0, BLOCK_M=16, BLOCK_N=plan.block_n,
        BLOCK_K=block_k, PDL=False, **launch)
    return out


def cycled_us(fn, ws, x, replays=20):
    fn(x, ws[0])
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(replays):
            fn(x, ws[i % len(ws)])
    return event_us(g.replay, 7) / replays


variants = {"engine": dict(), "s4": dict(stages=4), "s5": dict(stages=5), "w8": dict(warps=8),
            "k128": dict(block_k=128)}
for name, (n, k) in SHAPES.items():
    ws = [torch.randn((n, k), device="cuda", dtype=torch.bfloat16) * k**-0.5 for _ in range(4 if n * k < 2**28 else 2)]
    x = torch.randn((1, k), device="cuda", dtype=torch.bfloat16)
    ref = matmul.matmul(x, ws[0])
    row = []
    for vname, kw in variants.items():
        try:
            same = torch.equal(gemv(x, ws[0], **kw), ref)
            us = cycled_us(lambda a, b, kw=kw: gemv(a, b, **kw), ws, x)
            row.append(f"{vname} {us:.1f}us {n * k * 2 / us / 1e6:.2f}TB/s{'' if same else ' BITS-DIFFER'}")
        except Exception as e:
            row.append(f"{vname} error {str(e)[:80]}")
    print(name, matmul.plan_for(n, k, matmul.target_programs(x.device)), "|", " | ".join(row), flush=True)
    del ws
