"""Registers and spills of the prefill attention variants (8K, 8B heads), with their times."""
import sys
import torch
sys.path.insert(0, ".exp")
import attn_exp
from bench.bench_attention import case
from bench.bench_matmul import event_us
from lanes.kernels import attention
q, kc, vc, slots = case(8192, torch.Generator(device="cuda").manual_seed(1))
for rows, kw in [(128, {}), (128, dict(merge=False)), (128, dict(fuse=True)), (64, {}), (64, dict(num_warps=8))]:
    meta = attention.make_meta([(0, 8192, 8192, slots)], 4, q.device, rows)
    attn_exp.paged_attention(q, kc, vc, meta, **kw)
    k = attn_exp.LAST
    us = event_us(lambda: attn_exp.paged_attention(q, kc, vc, meta, **kw), 5)
    print(f"rows={rows} {kw} regs={k.n_regs} spills={k.n_spills} shared={k.metadata.shared} us={us:.0f}", flush=True)
