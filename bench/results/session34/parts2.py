# issue 45: per-kernel times of the chunked delta rule at 8K (2B-like), the 64-step substitution
# (HEAD's chunk kernel, .gpu/old_chunked.py) against the blocked one (working tree)
import importlib.util, json, sys, torch
from bench.kernels.matmul import event_us
from bench.kernels.delta_layer import _inputs
from bench.shapes import SHAPES
from lanes.kernels import chunked_delta as cd
spec = importlib.util.spec_from_file_location("old_chunked", ".gpu/old_chunked.py")
old = importlib.util.module_from_spec(spec); spec.loader.exec_module(old)
cfg = SHAPES["qwen3.5-2b-like"]
mixed, z, b, a, conv, state, w = _inputs(cfg, 8192, "cuda")
carry = cd.ChunkCarry.start(conv, state)
q, k, v, beta, g = cd.ref_features(mixed, b, a, conv, w)
span = [x.contiguous() for x in cd.span_rows(carry, q, k, v, beta, g)]
hv, dk, dv, C = 16, 128, 128, cd.CHUNK
nc = span[0].shape[0] // C
f32 = dict(dtype=torch.float32, device="cuda")
def mats():
    return [torch.empty((nc, hv, C, d), **f32) for d in (dk, dv, dk, dk)] + [torch.empty((nc, hv, C, C), **f32), torch.empty((nc, hv), **f32)]
def t(fn):
    try: return round(event_us(fn, 5) / 1e3, 3)
    except Exception as e: return repr(e)[:200]
outs = {}
for name, mod in (("old", old), ("blocked", cd)):
    for tf32 in (False, True):
        for warps in (4, 8):
            m = mats()
            kw = dict(num_warps=warps, num_stages=1, enable_fp_fusion=False)
            ms = t(lambda: mod._chunk_kernel[(nc, hv)](*span, *m, HV=hv, DK=dk, DV=dv, C=C, ROW_STABLE=False, TF32=tf32, **kw))
            outs[(name, tf32, warps)] = m[0].clone()
            ref = outs[("old", False, 4)]
            err = ((m[0] - ref).norm() / ref.norm()).item()
            print(json.dumps(dict(kernel="chunk", subst=name, tf32=tf32, warps=warps, ms=ms, w_rel_vs_old=err)), flush=True)
W, U, QG, KG, p, last = mats()
cd._chunk_kernel[(nc, hv)](*span, W, U, QG, KG, p, last, HV=hv, DK=dk, DV=dv, C=C, ROW_STABLE=False, TF32=False, num_warps=4, num_stages=1, enable_fp_fusion=False)
starts = torch.empty((nc, hv, dk, dv), **f32); d = torch.empty((nc, hv, C, dv), **f32)
o = torch.empty((nc * C, hv, dv), **f32); st = torch.empty_like(state)
ref = None
for tf32 in (False, True):
    for warps in (4, 8):
        kw = dict(num_warps=warps, num_stages=1, enable_fp_fusion=False)
        for bv in (16, 32, 64):
            c = dict(HV=hv, DK=dk, DV=dv, C=C, BLOCK_V=bv, ROW_STABLE=False, TF32=tf32)
            scan = t(lambda: cd._scan_kernel[(hv, dv // bv)](W, U, KG, last, state, starts, d, st, nc, nc, **c, **kw))
            out = t(lambda: cd._output_kernel[(nc, hv, dv // bv)](QG, p, starts, d, o, **c, **kw))
            if ref is None: ref = o.clone()
            err = ((o - ref).norm() / ref.norm()).item()
            print(json.dumps(dict(kernel="scan+output", tf32=tf32, warps=warps, block_v=bv, scan_ms=scan, output_ms=out, o_rel_vs_first=err)), flush=True)
# the whole layer as the model calls it, and the features kernel's share
fe = t(lambda: cd.chunked_gated_delta(mixed, z, b, a, carry, w))
print(json.dumps(dict(kernel="whole chunked_gated_delta", ms=fe)), flush=True)
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
    cd.chunked_gated_delta(mixed, z, b, a, carry, w); torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12))
