"""Prefill attention variants at 8K / 32K (timing only): what the partition merge in the walk,
fp fusion, stages, warps and rows per program cost. Run from the repo root with .exp on the path."""
import json, sys
import torch, torch.nn.functional as F
sys.path.insert(0, ".exp")
import attn_exp
from bench.bench_attention import case, HQ, HKV, D
from bench.bench_matmul import event_us
from lanes.kernels import attention

out = {}
for length in [int(x) for x in sys.argv[1:]] or [8192]:
    gen = torch.Generator(device="cuda").manual_seed(length)
    q, kc, vc, slots = case(length, gen)
    flops = 4 * HQ * D * length * length / 2
    k = kc[slots].transpose(0, 1).repeat_interleave(HQ // HKV, 0)[None]
    v = vc[slots].transpose(0, 1).repeat_interleave(HQ // HKV, 0)[None]
    qs = q.transpose(0, 1)[None]
    row = {"sdpa_us": event_us(lambda: F.scaled_dot_product_attention(qs, k, v, is_causal=True), 5)}
    seqs = [(0, length, length, slots)]
    base_meta = attention.make_meta(seqs, 4, q.device, 128)
    ref = attention.paged_attention(q, kc, vc, base_meta)
    row["current_us"] = event_us(lambda: attention.paged_attention(q, kc, vc, base_meta), 5)
    variants = {
        "exp_default": dict(),
        "fuse": dict(fuse=True),
        "no_merge": dict(merge=False),
        "no_merge_fuse": dict(merge=False, fuse=True),
        "stages2": dict(num_stages=2),
        "stages4": dict(num_stages=4),
        "warps4": dict(num_warps=4),
        "rows256_w8": dict(rows=256, num_warps=8, num_stages=2),
        "rows256_w16": dict(rows=256, num_warps=16, num_stages=2),
        "rows64_keys128_s3": dict(rows=64, num_stages=3),
    }
    for name, kw in variants.items():
        rows = kw.pop("rows", 128)
        meta = attention.make_meta(seqs, 4, q.device, rows) if rows != 128 else base_meta
        try:
            o = attn_exp.paged_attention(q, kc, vc, meta, **kw)
            us = event_us(lambda: attn_exp.paged_attention(q, kc, vc, meta, **kw), 5)
            row[name] = {"us": us, "tflops": flops / us / 1e6, "bits_equal_current": bool(torch.equal(o, ref)),
                         "max_abs_vs_current": float((o.float() - ref.float()).abs().max())}
        except Exception as e:
            row[name] = {"error": str(e)[:200]}
        print(length, name, row[name], flush=True)
    row["sdpa_tflops"] = flops / row["sdpa_us"] / 1e6
    row["current_tflops"] = flops / row["current_us"] / 1e6
    out[length] = row
    print(length, "sdpa", row["sdpa_us"], "current", row["current_us"], flush=True)
json.dump(out, open(sys.argv[0].replace(".py", ".json") if False else "/dev/stdout", "w"), indent=1)
