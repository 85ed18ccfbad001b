"""One 4-bit GEMV and its bf16 twin, for a kernel profiler (issue 19: the H200 measured the
packed decode ~30x slower than its bytes allow). Prints graph-replay medians per call; run under
`ncu --clock-control none -k regex:_matmul_kernel` for the counters.

    python -m bench.kernels.packed_gemv [--n 6144] [--k 4096] [--rows 1]
"""

from __future__ import annotations

import argparse

import torch

from bench.kernels.matmul import graph_us
from lanes.kernels import matmul
from lanes.packed import PackedWeight


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=6144)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--group", type=int, default=64)
    args = ap.parse_args()
    n, k, g = args.n, args.k, args.group
    gen = torch.Generator(device="cuda").manual_seed(0)
    codes = torch.randint(
        0, 2**31 - 1, (n, k // 8), generator=gen, device="cuda", dtype=torch.int32
    )
    scales = torch.rand((n, k // g), generator=gen, device="cuda").to(torch.bfloat16) * 0.01
    w4 = PackedWeight(codes.view(torch.uint32), scales, -7.5 * scales, 4, g)
    w16 = torch.randn((n, k), generator=gen, device="cuda", dtype=torch.bfloat16)
    x = torch.randn((args.rows, k), generator=gen, device="cuda", dtype=torch.bfloat16)
    for name, w, nbytes in (("bf16", w16, n * k * 2), ("packed4", w4, n * k // 2 + n * k // g * 4)):
        us = graph_us(lambda w=w: matmul.matmul(x, w))
        print(f"{name} n={n} k={k} rows={args.rows}: {us:.1f} us, {nbytes / us / 1e6:.2f} TB/s")


if __name__ == "__main__":
    main()
