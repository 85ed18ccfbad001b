"""4-bit (group 64) decode GEMV launch variants at M = 1 on the 8B qkv and gate_up shapes:
block_n x split x block_k x stages (x warps), six weight copies cycled past L2, the row against
the one-program path at M = 4096 with the same split (as the engine runs prefill)."""
import json
import torch, triton
from bench.bench_matmul import event_us
from lanes.kernels import matmul
from lanes.kernels.common import tickets
from lanes.packed import PackedWeight


def packed(n, k, g, gen):
    codes = torch.randint(0, 2**31 - 1, (n, k // 8), generator=gen, device="cuda", dtype=torch.int32)
    scales = torch.rand((n, k // g), generator=gen, device="cuda").to(torch.bfloat16) * 0.01
    return PackedWeight(codes.view(torch.uint32), scales, -7.5 * scales, 4, g)


def gemv(x, w, bn, split, bk, stages, warps, bm=16):
    m, k = x.shape
    n = w.shape[0]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    partial = split > 1 and bm == 16
    grid_mn = (triton.cdiv(m, bm), triton.cdiv(n, bn))
    counters = tickets(x.device, grid_mn[0] * grid_mn[1], "matmul")
    parts = torch.empty((split, m, n), dtype=torch.float32, device=x.device) if partial else out
    matmul._matmul_kernel[(*grid_mn, split) if partial else grid_mn](
        x, w.codes.view(torch.int32), w.scales, w.biases, out, out, parts, counters, m, n, k,
        x.stride(0), w.codes.stride(0), w.scales.stride(0), SEG_K=k // split, SPLIT=split,
        PARTIAL=partial, HAS_BIAS=False, UPCAST=False, ROW_STABLE=False, PACKED=True, BITS=4,
        GROUP=w.group, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, PDL=False, num_warps=warps,
        num_stages=stages)
    return out


if __name__ == "__main__":
    for name, (n, k), splits in (("qkv", (6144, 4096), (2, 4, 8)), ("gate_up", (28672, 4096), (1, 2, 4))):
        gen = torch.Generator(device="cuda").manual_seed(0)
        ws = [packed(n, k, 64, gen) for _ in range(6)]
        X = torch.randn((4096, k), device="cuda", dtype=torch.bfloat16, generator=gen)
        plan = matmul.plan_for(n, k, matmul.target_programs(X.device))
        nbytes = n * k // 2 + n * k // 64 * 4
        for split in splits:
            ref = gemv(X, ws[0], 128, split, 64, 4, 8, bm=128)[:1]
            for bn in (32, 64, 128):
                for bk in (64, 128):
                    for stages, warps in ((2, 4), (3, 4)) + (((3, 8),) if bn == 128 else ()):
                        try:
                            ok = torch.equal(gemv(X[:1], ws[0], bn, split, bk, stages, warps), ref)
                            g = torch.cuda.CUDAGraph()
                            with torch.cuda.graph(g):
                                for i in range(24):
                                    gemv(X[:1], ws[i % 6], bn, split, bk, stages, warps)
                            us = event_us(g.replay, 7) / 24
                            print(json.dumps(dict(shape=name, bn=bn, split=split, bk=bk, stages=stages, warps=warps, us=round(us, 2), tbs=round(nbytes / us / 1e6, 3), rows_ok=ok, engine=(bn, split, bk, stages, warps) == (plan.block_n, plan.split, 64, 3, 4))), flush=True)
                        except Exception as e:
                            print(json.dumps(dict(shape=name, bn=bn, split=split, bk=bk, stages=stages, warps=warps, error=str(e)[:100])), flush=True)
        del ws, X
