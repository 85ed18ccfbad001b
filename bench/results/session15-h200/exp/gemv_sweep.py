"""Decode GEMV tiling sweep on the 8B (and SmolLM2) weights: block_n x split x block_k x stages,
M = 1, four (two) weight copies cycled in one graph so nothing stays in L2; every config's rows
at M = 1, 37, 64 checked against the prefill path's rows at M = 4096 with the same split (the
engine's invariance). Then the prefill tiles' time per split at M = 8192. JSON lines."""
import json, sys, time
import torch, triton
from bench.bench_matmul import event_us
from lanes.kernels import matmul
from lanes.kernels.common import tickets

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
          "lm_head": (128256, 4096), "s_qkv": (960, 576), "s_o": (576, 576),
          "s_gate_up": (3072, 576), "s_down": (576, 1536), "s_lm_head": (49152, 576)}
only = sys.argv[1].split(",") if len(sys.argv) > 1 else list(SHAPES)


def gemv(x, w, block_n, split, block_k, stages, warps=4):
    m, k = x.shape
    n = w.shape[0]
    block_m = 16 if m <= 16 else 64
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    partial = split > 1
    grid_mn = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    counters = tickets(x.device, grid_mn[0] * grid_mn[1], "matmul")
    parts = torch.empty((split, m, n), dtype=torch.float32, device=x.device) if partial else out
    matmul._matmul_kernel[(*grid_mn, split) if partial else grid_mn](
        x, w, out, out, out, out, parts, counters, m, n, k, x.stride(0), w.stride(0), 0,
        SEG_K=k // split, SPLIT=split, PARTIAL=partial, HAS_BIAS=False, UPCAST=False,
        ROW_STABLE=False, PACKED=False, BITS=0, GROUP=0, BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_K=block_k, PDL=False, num_warps=warps, num_stages=stages)
    return out


def cycled_us(fn, ws, x, replays=20):
    fn(x, ws[0])
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(replays):
            fn(x, ws[i % len(ws)])
    return event_us(g.replay, 7) / replays


def prefill_rows(X, w, split):
    out = torch.empty((X.shape[0], w.shape[0]), dtype=X.dtype, device=X.device)
    matmul.matmul_tiles(X, w, None, out, split, matmul.prefill_tiles_for(X, w))
    return out


def configs(n, k):
    plan = matmul.plan_for(n, k, matmul.target_programs(torch.device("cuda")))
    yield plan.block_n, plan.split, 64
    blocks = k // 64
    small = n * k < 2**22
    for bn in (16, 32, 64) if small else (32, 64, 128):
        tiles = triton.cdiv(n, bn)
        for split in range(1, 17):
            if blocks % split or not (200 <= tiles * split <= 900 or (split == 1 and tiles * split > 900 and bn >= 64) or (small and tiles * split <= 1100)):
                continue
            if split > 1 and (k // split) // 64 < 2 or (small and split > 3):
                continue
            for bk in (64, 128, 256):
                if (k // split) % bk or (bk == 256 and bn > 64) or (bn, split, bk) == (plan.block_n, plan.split, 64):
                    continue
                yield bn, split, bk


t0 = time.time()
for name in only:
    n, k = SHAPES[name]
    plan = matmul.plan_for(n, k, matmul.target_programs(torch.device("cuda")))
    copies = 4 if n * k < 2**28 else 2
    gen = torch.Generator(device="cuda").manual_seed(0)
    ws = [torch.randn((n, k), device="cuda", dtype=torch.bfloat16, generator=gen) * k**-0.5 for _ in range(copies)]
    X = torch.randn((4096, k), device="cuda", dtype=torch.bfloat16, generator=gen)
    results = []
    ref_rows = {}
    for bn, split, bk in configs(n, k):
        try:
            if split not in ref_rows:
                ref_rows[split] = prefill_rows(X, ws[0], split)
            ok = torch.equal(gemv(X[:1], ws[0], bn, split, bk, 3), ref_rows[split][:1])
            us = cycled_us(lambda a, b: gemv(a, b, bn, split, bk, 3), ws, X[:1])
            r = dict(shape=name, bn=bn, split=split, bk=bk, stages=3, us=round(us, 2),
                     tbs=round(n * k * 2 / us / 1e6, 3), rows_ok=ok,
                     engine=(bn == plan.block_n and split == plan.split and bk == 64))
        except Exception as e:
            r = dict(shape=name, bn=bn, split=split, bk=bk, error=str(e)[:120])
        results.append(r)
        print(json.dumps(r), flush=True)
    good = sorted((r for r in results if r.get("rows_ok")), key=lambda r: r["us"])[:2]
    for r in good:  # rows of 37 and 64 (64-row tiles)
        r["rows_37_64_ok"] = all(torch.equal(gemv(X[:m], ws[0], r["bn"], r["split"], r["bk"], 3), ref_rows[r["split"]][:m]) for m in (37, 64))
        print(json.dumps(r), flush=True)
    for r in good:  # stages and warps for the best three
        for stages, warps in ((2, 4), (4, 4), (3, 8)):
            try:
                ok = all(torch.equal(gemv(X[:m], ws[0], r["bn"], r["split"], r["bk"], stages, warps), ref_rows[r["split"]][:m]) for m in (1, 37, 64))
                us = cycled_us(lambda a, b: gemv(a, b, r["bn"], r["split"], r["bk"], stages, warps), ws, X[:1])
                print(json.dumps(dict(shape=name, bn=r["bn"], split=r["split"], bk=r["bk"], stages=stages, warps=warps, us=round(us, 2), tbs=round(n * k * 2 / us / 1e6, 3), rows_ok=ok)), flush=True)
            except Exception as e:
                print(json.dumps(dict(shape=name, bn=r["bn"], split=r["split"], bk=r["bk"], stages=stages, warps=warps, error=str(e)[:120])), flush=True)
    # 64 rows: the engine's launch against the best M = 1 config
    if good:
        b = good[0]
        x64 = X[:64]
        e64 = cycled_us(lambda a, bb: gemv(a, bb, plan.block_n, plan.split, 64, 3), ws, x64)
        b64 = cycled_us(lambda a, bb: gemv(a, bb, b["bn"], b["split"], b["bk"], 3), ws, x64)
        print(json.dumps(dict(shape=name, m=64, engine_us=round(e64, 2), best_us=round(b64, 2), best=[b["bn"], b["split"], b["bk"]])), flush=True)
    # prefill tiles per split, M = 8192 (weights fit in L2 or not: one copy, compute-bound)
    if n * k >= 2**22:
        X8 = torch.randn((8192, k), device="cuda", dtype=torch.bfloat16, generator=gen)
        out8 = torch.empty((8192, n), device="cuda", dtype=torch.bfloat16)
        tiles = matmul.prefill_tiles_for(X8, ws[0])
        for split in sorted({r["split"] for r in results if "us" in r} | {plan.split}):
            us = event_us(lambda: matmul.matmul_tiles(X8, ws[0], None, out8, split, tiles), 9)
            print(json.dumps(dict(shape=name, prefill_m=8192, split=split, us=round(us, 1), tflops=round(2 * 8192 * n * k / us / 1e6, 1), engine=split == plan.split)), flush=True)
        del X8, out8
    del ws, X
    torch.cuda.empty_cache()
    print(json.dumps(dict(shape=name, done_s=round(time.time() - t0, 1))), flush=True)
