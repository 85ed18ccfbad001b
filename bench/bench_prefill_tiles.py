"""Prefill GEMM tiles: the batch-invariant matmul's one-program path (M > 64) launched with larger
tiles, more warps and pipeline stages, on the 8B layer shapes at M = 8192: time per call against
cuBLAS, and whether every row still has the bits of the decode path (M = 1 and 37).

    python -m bench.bench_prefill_tiles [--rows 8192] [--out FILE]

An experiment for the next kernel change (issue 17, prefill at tensor-core speed): the engine
itself launches the 64 x 64 tiles of kernels/matmul.py.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
import triton

from bench.bench_matmul import event_us
from bench.kernel_check import LAYERS_8B
from lanes.kernels import matmul

VARIANTS = [  # (BLOCK_M, BLOCK_N, num_warps, num_stages); the first is what matmul launches
    (64, 64, 4, 3),
    (128, 64, 4, 3),
    (64, 128, 4, 3),
    (128, 128, 4, 3),
    (128, 128, 8, 3),
    (128, 128, 8, 4),
    (128, 256, 8, 3),
]


def launch(x, w, out, plan, block_m, block_n, warps, stages):
    m, k = x.shape
    n = w.shape[0]
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    matmul._matmul_kernel[grid](
        x, w, out, out, out, out, m, n, k, x.stride(0), w.stride(0), k // plan.split,
        SPLIT=plan.split, PARTIAL=False, HAS_BIAS=False, UPCAST=False,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=matmul.BLOCK_K,
        num_warps=warps, num_stages=stages,
    )  # fmt: skip


def shape_row(n: int, k: int, rows: int, plan) -> dict:
    w = torch.randn((n, k), device="cuda", dtype=torch.bfloat16) * k**-0.5
    x = torch.randn((rows, k), device="cuda", dtype=torch.bfloat16)
    decode = torch.cat([matmul.matmul(x[:1], w), matmul.matmul(x[:37], w)[1:]])  # rows 0-36
    flops = 2 * rows * n * k
    row = {"plan": [plan.block_n, plan.split], "cublas_us": event_us(lambda: F.linear(x, w), 7)}
    row["cublas_tflops"] = flops / row["cublas_us"] / 1e6
    for v in VARIANTS:
        out = torch.empty((rows, n), device="cuda", dtype=torch.bfloat16)
        try:
            us = event_us(lambda o=out, v=v: launch(x, w, o, plan, *v), 7)
        except Exception as e:  # out of shared memory, etc.
            row[str(v)] = {"error": str(e)[:120]}
            continue
        row[str(v)] = {
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
    for name, (n, k) in LAYERS_8B.items():
        row = shape_row(n, k, args.rows, matmul.plan_for(n, k, target))
        report["shapes"][name] = row
        print(name, json.dumps(row), flush=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
