"""Prefill GEMM tiles: the batch-invariant matmul's one-program path (M > 64) with pointer loads,
and the tensor-descriptor kernel in several tile layouts, on the 8B layer shapes at M = 8192:
time per call against cuBLAS, and whether every row still has the bits of the decode path (M = 1
and 37).

    python -m bench.kernels.prefill_tiles [--rows 8192] [--out FILE]

The experiment behind matmul's prefill tiles (issue 17, prefill at tensor-core speed).
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
import triton

from bench.kernels.check import LAYERS_8B
from bench.kernels.matmul import event_us
from lanes.kernels import matmul

# (BLOCK_M, BLOCK_N, num_warps, num_stages) of _matmul_kernel's one-program path (pointer loads),
# what matmul launched for M > 64 before the tensor-descriptor kernel
POINTER_TILES = (128, 128, 8, 4)
TMA_VARIANTS = [
    matmul.PrefillTiles(128, 128, num_stages=4),
    matmul.PrefillTiles(128, 128, num_stages=3),
    matmul.PrefillTiles(128, 128, num_stages=4, flatten=True),
    matmul.PrefillTiles(128, 128, num_stages=4, group_m=1),
    matmul.PrefillTiles(128, 256, num_stages=3),
    matmul.PrefillTiles(128, 256, num_stages=4),
    matmul.PrefillTiles(256, 128, num_stages=3),
    matmul.PrefillTiles(128, 128, num_warps=4, num_stages=4),
]


def launch_pointer_tiles(x, w, out, plan):
    block_m, block_n, warps, stages = POINTER_TILES
    m, k = x.shape
    n = w.shape[0]
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    matmul._matmul_kernel[grid](
        x, w, out, out, out, out, out, out, m, n, k, x.stride(0), w.stride(0), 0,
        k // plan.split, SPLIT=plan.split, PARTIAL=False, HAS_BIAS=False, UPCAST=False,
        PACKED=False, BITS=0, GROUP=0, BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_K=matmul.BLOCK_K, PDL=False, num_warps=warps, num_stages=stages,
    )  # fmt: skip


def shape_row(n: int, k: int, rows: int, plan) -> dict:
    w = torch.randn((n, k), device="cuda", dtype=torch.bfloat16) * k**-0.5
    x = torch.randn((rows, k), device="cuda", dtype=torch.bfloat16)
    decode = torch.cat([matmul.matmul(x[:1], w), matmul.matmul(x[:37], w)[1:]])  # rows 0-36
    flops = 2 * rows * n * k
    row = {"plan": [plan.block_n, plan.split], "cublas_us": event_us(lambda: F.linear(x, w), 7)}
    row["cublas_tflops"] = flops / row["cublas_us"] / 1e6
    variants = {f"pointer {POINTER_TILES}": lambda o: launch_pointer_tiles(x, w, o, plan)}
    for t in TMA_VARIANTS:
        variants[f"tma {t}"] = lambda o, t=t: matmul.matmul_tiles(x, w, None, o, plan.split, t)
    for key, fn in variants.items():
        out = torch.empty((rows, n), device="cuda", dtype=torch.bfloat16)
        try:
            us = event_us(lambda o=out, fn=fn: fn(o), 7)
        except Exception as e:  # out of shared memory, etc.
            row[key] = {"error": str(e)[:160]}
            continue
        row[key] = {
            "us": us,
            "tflops": flops / us / 1e6,
            "rows_equal_decode": bool(torch.equal(out[:37], decode)),
        }
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--out", default="bench/results/prefill-tiles-h200.json")
    args = ap.parse_args()
    target = matmul.target_programs(torch.device("cuda"))
    report = {"device": torch.cuda.get_device_name(), "rows": args.rows, "shapes": {}}
    wide = matmul.wide_steps(torch.bfloat16, torch.device("cuda"))
    for name, (n, k) in LAYERS_8B.items():
        row = shape_row(n, k, args.rows, matmul.plan_for(n, k, target, wide))
        report["shapes"][name] = row
        print(name, json.dumps(row), flush=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
