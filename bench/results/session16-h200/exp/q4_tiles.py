"""Session 16 call 3 (issue 19): which tiles for 17-64 rows and for prefill give every row the
bits of the M = 1 decode tile (call 2: block_m 16 variants agree among themselves, 64- and
128-row tiles and weight-left tiles of >= 64 columns do not)? Then prefill speed of those that
agree; writes the choice to argv[1]."""
import json
import sys
import time

import torch

from bench.bench_matmul import event_us
from lanes.kernels import matmul
from lanes.kernels import packed_matmul as pm
from lanes.packed import PackedWeight

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
          "down": (4096, 14336), "lm_head": (128256, 4096)}
T = pm.PackedTiles
FEW = {"m64w4": T(64, None, 4), "m64w2": T(64, None, 2), "m32w4": T(32, None, 4),
       "m16w4": T(16, None, 4), "m64n32L": T(64, 32, 4, True), "m32n64w2": T(32, 64, 2)}
PRE = {"m128n128w8": T(128, 128, 8), "m64n128w2": T(64, 128, 2), "m128n32Lw4": T(128, 32, 4, True),
       "m256n32Lw4": T(256, 32, 4, True), "m64n64w2": T(64, 64, 2), "m16n128w4": T(16, 128, 4),
       "m32n128w4": T(32, 128, 4), "m32n64w2": T(32, 64, 2), "m128n32Lw2": T(128, 32, 2, True)}


def weight(n, k):
    gen = torch.Generator(device="cuda").manual_seed(n + k)
    codes = torch.randint(-(2**31), 2**31 - 1, (n, k // 8), generator=gen, device="cuda", dtype=torch.int32)
    scales = (torch.rand((n, k // 64), generator=gen, device="cuda") * 0.01).to(torch.bfloat16)
    return PackedWeight(codes.view(torch.uint32), scales, -7.5 * scales, 4, 64)


agree = {f"few {n}": True for n in FEW} | {f"pre {n}": True for n in PRE}
diag = {}
x = torch.randn((2048, 14336), device="cuda", dtype=torch.bfloat16)
t0 = time.time()
for name, (n, k) in SHAPES.items():
    w = weight(n, k)
    xs = x[:, :k].contiguous()
    rows = [0, 5, 17, 36, 100, 255, 299]
    one = torch.cat([pm.packed_matmul(xs[i:i + 1], w, None, pm.DECODE_TILES) for i in rows])
    for key, t in FEW.items():
        try:
            got = pm.packed_matmul(xs[:37], w, None, t)
            ok = torch.equal(got[rows[:4]], one[:4])
        except Exception as e:  # noqa: BLE001
            ok = f"error {type(e).__name__}: {str(e)[:100]}"
        if ok is not True:
            agree[f"few {key}"] = ok if isinstance(ok, str) else False
    for key, t in PRE.items():
        try:
            got = pm.packed_matmul(xs[:300], w, None, t)
            ok = torch.equal(got[rows], one)
        except Exception as e:  # noqa: BLE001
            ok = f"error {type(e).__name__}: {str(e)[:100]}"
        if ok is not True:
            agree[f"pre {key}"] = ok if isinstance(ok, str) else False
    # diagnostic: the fp32 route (no packed pairs) at the old tiles
    orig = pm.paired
    pm.paired = lambda *a: False
    a1 = pm.packed_matmul(xs[:1], w, None, pm.DECODE_TILES)
    diag[name] = {"fp32 route m64w4": torch.equal(pm.packed_matmul(xs[:37], w, None, FEW["m64w4"])[:1], a1),
                  "fp32 route m128n128w8": torch.equal(pm.packed_matmul(xs[:300], w, None, PRE["m128n128w8"])[:1], a1)}
    pm.paired = orig
    # and the dense kernel on the dequantized weight, M = 1 against 37 and 300
    wd = w.rows(0, n).contiguous()
    d1 = matmul.matmul(xs[:1], wd)
    diag[name]["dense m37"] = torch.equal(matmul.matmul(xs[:37], wd)[:1], d1)
    diag[name]["dense m300"] = torch.equal(matmul.matmul(xs[:300], wd)[:1], d1)
    del wd
    print(name, f"{time.time() - t0:.0f}s", json.dumps(diag[name]), flush=True)
print(json.dumps(agree, indent=1), flush=True)
# speed of the agreeing ones: prefill at M = 2048 (gate_up + down), few rows at M = 37 (qkv + gate_up)
speed = {}
for role, table, m, names in (("pre", PRE, 2048, ("gate_up", "down")), ("few", FEW, 37, ("qkv", "gate_up"))):
    for key, t in table.items():
        if agree[f"{role} {key}"] is not True:
            continue
        total = 0.0
        for name in names:
            n, k = SHAPES[name]
            w = weight(n, k)
            xs = x[:m, :k].contiguous()
            total += event_us(lambda: pm.packed_matmul(xs, w, None, t), 5)
        speed[f"{role} {key}"] = round(total, 1)
        print(role, key, speed[f"{role} {key}"], flush=True)
best = {role: min((k for k in speed if k.startswith(role)), key=speed.get, default=None) for role in ("few", "pre")}
out = {"agree": agree, "diag": diag, "speed_us": speed, "best": best}
print(json.dumps(out["best"]))
json.dump(out, open(sys.argv[1], "w"), indent=1)
