"""The engine's glu_matmul (gated prefill tiles) against silu_mul + matmul on the 8B down
projection: us per call, bits."""
import torch
from bench.bench_matmul import event_us
from lanes.kernels import matmul
from lanes.kernels.activation import silu_mul
width, n = 14336, 4096
gen = torch.Generator(device="cuda").manual_seed(0)
w = torch.randn((n, width), generator=gen, device="cuda", dtype=torch.bfloat16) * width**-0.5
for m in (8192, 2048, 512):
    gate_up = torch.randn((m, 2 * width), generator=gen, device="cuda", dtype=torch.bfloat16)
    ref = matmul.matmul(silu_mul(gate_up), w)
    fused = matmul.glu_matmul(gate_up, w)
    two = event_us(lambda: matmul.matmul(silu_mul(gate_up), w), 9)
    one = event_us(lambda: matmul.glu_matmul(gate_up, w), 9)
    print(f"M={m}: silu_mul + matmul {two:.0f} us, glu_matmul {one:.0f} us, bits equal {torch.equal(fused, ref)}", flush=True)
