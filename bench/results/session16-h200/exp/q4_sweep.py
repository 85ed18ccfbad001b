"""Session 16 (issue 19): the word-sliced packed kernel. Per 8B weight shape at M = 1: the old
kernel (from .before, passed as argv[1] == 'before'), and the new one over tile variants; times
from CUDA-graph replays cycling through copies of the weight (> 2x L2, so no weight is hit in
L2); bits of every variant's M = 1 row against the default tiles at M = 1, 37 and 300."""

import json
import sys
import time

import torch

from bench.bench_matmul import event_us
from lanes.kernels import matmul
from lanes.packed import PackedWeight

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
          "down": (4096, 14336), "lm_head": (128256, 4096)}


def weights(n, k, bits, copies, dtype=None):
    gen = torch.Generator(device="cuda").manual_seed(n + k + bits)
    out = []
    for _ in range(copies):
        if dtype is not None:
            out.append(torch.randn((n, k), generator=gen, device="cuda", dtype=dtype) * k**-0.5)
            continue
        codes = torch.randint(-(2**31), 2**31 - 1, (n, k * bits // 32), generator=gen,
                              device="cuda", dtype=torch.int32)
        scales = (torch.rand((n, k // 64), generator=gen, device="cuda") * 0.01).to(torch.bfloat16)
        out.append(PackedWeight(codes.view(torch.uint32), scales, -7.5 * scales, bits, 64))
    return out


def cold_us(fn, ws, replays=60):
    """Median us per call, a graph of `replays` calls cycling through the copies ws."""
    for w in ws:
        fn(w)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(replays):
            fn(ws[i % len(ws)])
    return event_us(graph.replay, 7) / replays


def copies_for(nbytes):
    return max(2, -(-120_000_000 // nbytes))


tag = sys.argv[1]
res = {}
x = torch.randn((300, 14336), device="cuda", dtype=torch.bfloat16)
if tag == "before":
    for name, (n, k) in SHAPES.items():
        ws = weights(n, k, 4, copies_for(n * k // 2))
        res[name] = round(cold_us(lambda w: matmul.matmul(x[:1, :k], w), ws), 2)
        print("before", name, res[name], flush=True)
    print(json.dumps({"before_4bit": res}))
    sys.exit()

from lanes.kernels import packed_matmul as pm  # noqa: E402

variants = [pm.PackedTiles(16, bn, 4, left) for bn in (32, 64, 128) for left in (False, True)]
variants += [pm.PackedTiles(16, 128, 8, False), pm.PackedTiles(16, 128, 8, True)]
variants.append(pm.PackedTiles(16, None, 4, False))
rows = {}
bits_bad = []
t0 = time.time()
for name, (n, k) in SHAPES.items():
    xs = x[:, :k].contiguous()
    ws16 = weights(n, k, 0, copies_for(n * k * 2), torch.bfloat16)
    rows[name] = {"bf16": round(cold_us(lambda w: matmul.matmul(xs[:1], w), ws16), 2)}
    del ws16
    ws = weights(n, k, 4, copies_for(n * k // 2))
    want1 = matmul.matmul(xs[:1], ws[0])
    ref = matmul.ref_matmul(xs[:1], ws[0]).float()
    if not (torch.equal(matmul.matmul(xs[:37], ws[0])[:1], want1)
            and torch.equal(matmul.matmul(xs[:300], ws[0])[:1], want1)):
        bits_bad.append(f"{name} default tiles M=37/300")
    rows[name]["err_vs_ref"] = (want1.float() - ref).abs().max().item()
    for v in variants:
        key = f"bn{v.block_n}{'L' if v.weight_left else 'R'}w{v.num_warps}"
        try:
            got = pm.packed_matmul(xs[:1], ws[0], None, v)
            if not torch.equal(got, want1):
                bits_bad.append(f"{name} {key}")
            rows[name][key] = round(cold_us(lambda w, v=v: pm.packed_matmul(xs[:1], w, None, v), ws), 2)
        except Exception as e:  # noqa: BLE001
            rows[name][key] = f"error {type(e).__name__}: {str(e)[:120]}"
        print(name, key, rows[name][key], f"{time.time() - t0:.0f}s", flush=True)
    del ws
    print(json.dumps({name: rows[name]}), flush=True)
# prefill: M = 2048 on gate_up and down, default PREFILL_TILES and a few others, against bf16
pre = {}
for name in ("gate_up", "down"):
    n, k = SHAPES[name]
    xs = torch.randn((2048, k), device="cuda", dtype=torch.bfloat16)
    w16 = weights(n, k, 0, 1, torch.bfloat16)[0]
    pre[f"{name} bf16"] = round(event_us(lambda: matmul.matmul(xs, w16), 5), 1)
    del w16
    w4 = weights(n, k, 4, 1)[0]
    want = matmul.matmul(xs[:1], w4)
    for v in (pm.PREFILL_TILES, pm.PackedTiles(128, 128, 8, True), pm.PackedTiles(64, 128, 4, False),
              pm.PackedTiles(128, 64, 4, False), pm.PackedTiles(64, 256, 8, True)):
        key = f"{name} m{v.block_m}n{v.block_n}{'L' if v.weight_left else 'R'}w{v.num_warps}"
        try:
            got = pm.packed_matmul(xs, w4, None, v)
            if not torch.equal(got[:1], want):
                bits_bad.append(key)
            pre[key] = round(event_us(lambda v=v: pm.packed_matmul(xs, w4, None, v), 5), 1)
        except Exception as e:  # noqa: BLE001
            pre[key] = f"error {type(e).__name__}: {str(e)[:120]}"
        print(key, pre[key], flush=True)
keys = [k for k in rows["qkv"] if k.startswith("bn")]
step = {}
for key in keys:
    try:
        step[key] = round(32 * sum(rows[s][key] for s in ("qkv", "o", "gate_up", "down"))
                          + rows["lm_head"][key], 1)
    except TypeError:
        pass
step["bf16"] = round(32 * sum(rows[s]["bf16"] for s in ("qkv", "o", "gate_up", "down"))
                     + rows["lm_head"]["bf16"], 1)
best = min((k for k in step if k != "bf16"), key=step.get)
print(json.dumps({"gemv_us": rows, "prefill_us": pre, "bits_differ": bits_bad,
                  "step_gemv_us": step, "best": best}, indent=1))
json.dump({"gemv_us": rows, "prefill_us": pre, "bits_differ": bits_bad, "step_gemv_us": step,
           "best": best}, open(sys.argv[2], "w"), indent=1)
