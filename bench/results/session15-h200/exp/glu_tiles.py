"""Prefill down projection with silu(gate) * up made from TMA-loaded gate/up tiles in the
prologue, against silu_mul + matmul's tiles: time and bits (8B down: K = 14336, N = 4096)."""
import sys
import torch, triton, triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor
from bench.bench_matmul import event_us
from lanes.kernels import matmul
from lanes.kernels.activation import silu_mul


@triton.jit
def _silu_times(gate, up, like_ptr):
    dtype = like_ptr.dtype.element_ty
    gate = gate.to(tl.float32)
    silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    return (silu * up.to(tl.float32)).to(dtype)


@triton.jit
def _glu_tiles_kernel(g_desc, w_desc, out_ptr, M, N, WIDTH, SEG_K, SPLIT: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = pid // per_group * GROUP_M
    group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows
    total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for s in tl.range(0, SPLIT):
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kb in range(0, SEG_K, BLOCK_K):
            k = s * SEG_K + kb
            gate = g_desc.load([pid_m * BLOCK_M, k])
            up = g_desc.load([pid_m * BLOCK_M, WIDTH + k])
            a = _silu_times(gate, up, out_ptr)
            b = w_desc.load([pid_n * BLOCK_N, k])
            acc = tl.dot(a, tl.trans(b), acc)
        total += acc
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rm < M)[:, None] & (rn < N)[None, :]
    tl.store(out_ptr + rm[:, None] * N + rn[None, :], total.to(out_ptr.dtype.element_ty), mask=mask)


def glu_tiles(gate_up, w, bm, bn, warps, stages):
    m, width = gate_up.shape[0], gate_up.shape[1] // 2
    n = w.shape[0]
    split = matmul.split_for(n, width, gate_up.device)
    out = torch.empty((m, n), dtype=gate_up.dtype, device=gate_up.device)
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    _glu_tiles_kernel[grid](
        TensorDescriptor.from_tensor(gate_up, [bm, matmul.BLOCK_K]),
        TensorDescriptor.from_tensor(w, [bn, matmul.BLOCK_K]),
        out, m, n, width, width // split, SPLIT=split, BLOCK_M=bm, BLOCK_N=bn,
        BLOCK_K=matmul.BLOCK_K, GROUP_M=8, num_warps=warps, num_stages=stages)
    return out


m, width, n = 8192, 14336, 4096
gen = torch.Generator(device="cuda").manual_seed(0)
gate_up = torch.randn((m, 2 * width), generator=gen, device="cuda", dtype=torch.bfloat16)
w = torch.randn((n, width), generator=gen, device="cuda", dtype=torch.bfloat16) * width**-0.5
ref = matmul.matmul(silu_mul(gate_up), w)
print("silu_mul us", event_us(lambda: silu_mul(gate_up), 7))
print("matmul tiles us", event_us(lambda: matmul.matmul(silu_mul(gate_up), w), 7), "(incl. silu_mul)")
h = silu_mul(gate_up)
print("matmul alone us", event_us(lambda: matmul.matmul(h, w), 7))
for bm, bn, warps, stages in [(128, 256, 8, 3), (128, 256, 8, 4), (128, 128, 8, 4), (256, 128, 8, 3), (128, 256, 8, 2)]:
    try:
        out = glu_tiles(gate_up, w, bm, bn, warps, stages)
        us = event_us(lambda: glu_tiles(gate_up, w, bm, bn, warps, stages), 7)
        print(f"glu tiles {bm}x{bn} w{warps} s{stages}: {us:.0f} us, bits equal: {torch.equal(out, ref)}", flush=True)
    except Exception as e:
        print(f"glu tiles {bm}x{bn} w{warps} s{stages}: error {str(e)[:150]}", flush=True)
