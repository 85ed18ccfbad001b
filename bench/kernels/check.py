"""GPU check of every registered kernel: against its reference (per dtype, fresh random inputs),
and batch invariance bitwise on real layer shapes, with cuBLAS as the negative control.

    python -m bench.kernels.check      # writes bench/results/kernels-gpu.json (read by `lanes kernels`)
"""

from __future__ import annotations

import datetime
import json

import torch
import torch.nn.functional as F

from bench import RESULTS
from lanes.kernels import matmul
from lanes.kernels.registry import REGISTRY

OUT = RESULTS / "kernels-gpu.json"
LAYERS_8B = {
    "qkv": (6144, 4096),
    "o": (4096, 4096),
    "gate_up": (28672, 4096),
    "down": (4096, 14336),
}
LAYERS_SMOLLM2 = {  # narrow: 32-column tiles, K = 576 split in 9
    "smollm2_qkv": (960, 576),
    "smollm2_o": (576, 576),
    "smollm2_gate_up": (3072, 576),
    "smollm2_down": (576, 1536),
}


def check_reference(spec) -> dict:
    gen = torch.Generator().manual_seed(0)
    worst = 0.0
    try:
        for dtype in spec.dtypes:
            rtol, atol = spec.tolerance[dtype]
            for case in spec.cases(dtype, "cuda", gen):
                out, ref = spec.run(*case), spec.ref(*case)
                pairs = zip(out, ref, strict=True) if isinstance(out, tuple) else [(out, ref)]
                for o, r in pairs:
                    if o.dtype in (torch.int64, torch.int32):
                        assert torch.equal(o.cpu(), r.cpu()), "tokens differ from the reference"
                    else:
                        torch.testing.assert_close(o.float(), r.float(), rtol=rtol, atol=atol)
                        worst = max(worst, float((o.float() - r.float()).abs().max()))
        return {"result": "pass", "max_abs_error": worst}
    except AssertionError as e:
        return {"result": "FAIL", "error": str(e)[:300]}


def _rows_equal(fn, xs: torch.Tensor, repeats: int) -> bool:
    full = fn(xs)
    return all(torch.equal(fn(xs[:m]), full[:m]) for m in (1, 37, 64, 128) for _ in range(repeats))


def _shape_invariance(n: int, k: int, gen: torch.Generator, repeats: int) -> dict:
    w = torch.randn((n, k), generator=gen, device="cuda", dtype=torch.bfloat16) * k**-0.5
    plain = torch.randn((4096, k), generator=gen, device="cuda", dtype=torch.bfloat16)
    cuda = torch.device("cuda")
    plan = matmul.plan_for(n, k, matmul.target_programs(cuda), matmul.wide_steps(w.dtype, cuda))
    return {
        "split_k": plan.split,
        "block_n": plan.block_n,
        "triton_rows_equal": _rows_equal(lambda t: matmul.matmul(t, w), plain, repeats),
        "cublas_rows_equal": _rows_equal(lambda t: F.linear(t, w), plain, repeats),
        "max_abs_vs_cublas": float(
            (matmul.matmul(plain, w).float() - F.linear(plain, w).float()).abs().max()
        ),
    }


def matmul_invariance(repeats: int = 10) -> dict:
    """Every row of M = 1, 37, 64, 128 rows (the split-K path reduced by the last arrival, each
    launch repeated: a race would show as a differing launch) against the same rows of M = 4096
    (one program per tile): equal bits for Triton; cuBLAS as the negative control."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    shapes = {**LAYERS_8B, **LAYERS_SMOLLM2}
    return {name: _shape_invariance(n, k, gen, repeats) for name, (n, k) in shapes.items()}


def main() -> None:
    report = {
        "date": datetime.date.today().isoformat(),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "kernels": {spec.name: check_reference(spec) for spec in REGISTRY},
        "matmul_invariance_8b_layers": matmul_invariance(),
    }
    OUT.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
