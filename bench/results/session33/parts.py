import torch, json, sys
from bench.kernels.matmul import event_us
from bench.kernels.delta_layer import _inputs
from bench.shapes import SHAPES
from lanes.kernels import chunked_delta as cd
cfg = SHAPES["qwen3.5-2b-like"]
mixed, z, b, a, conv, state, w = _inputs(cfg, 8192, "cuda")
carry = cd.ChunkCarry.start(conv, state)
q, k, v, beta, g = cd.ref_features(mixed, b, a, conv, w)
span = [x.contiguous() for x in cd.span_rows(carry, q, k, v, beta, g)]
hv, dk, dv, C = 16, 128, 128, cd.CHUNK
nc = span[0].shape[0] // C
f32 = dict(dtype=torch.float32, device="cuda")
W, U, QG, KG = [torch.empty((nc, hv, C, d), **f32) for d in (dk, dv, dk, dk)]
p = torch.empty((nc, hv, C, C), **f32); last = torch.empty((nc, hv), **f32)
starts = torch.empty((nc, hv, dk, dv), **f32); d = torch.empty((nc, hv, C, dv), **f32)
o = torch.empty((nc * C, hv, dv), **f32); st = torch.empty_like(state)
ref = None
def t(fn):
    try: return round(event_us(fn, 5) / 1e3, 3)
    except Exception as e: return repr(e)[:90]
for tf32 in (False, True):
    for warps in (4, 8):
        kw = dict(num_warps=warps, num_stages=1, enable_fp_fusion=False)
        chunk = t(lambda: cd._chunk_kernel[(nc, hv)](*span, W, U, QG, KG, p, last, HV=hv, DK=dk, DV=dv, C=C, ROW_STABLE=False, TF32=tf32, **kw))
        for bv in (16, 32, 64):
            c = dict(HV=hv, DK=dk, DV=dv, C=C, BLOCK_V=bv, ROW_STABLE=False, TF32=tf32)
            scan = t(lambda: cd._scan_kernel[(hv, dv // bv)](W, U, KG, last, state, starts, d, st, nc, nc, **c, **kw))
            out = t(lambda: cd._output_kernel[(nc, hv, dv // bv)](QG, p, starts, d, o, **c, **kw))
            if ref is None: ref = o.clone()
            err = ((o - ref).norm() / ref.norm()).item()
            print(json.dumps(dict(tf32=tf32, warps=warps, block_v=bv, chunk_ms=chunk, scan_ms=scan, output_ms=out, rel_vs_first=err)), flush=True)
