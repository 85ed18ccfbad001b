"""Session 15: the delta-rule kernel's prefill time by value-column block and warps (one lane,
8K rows, the Qwen3.5-2B-like head layout: 16 key / 16 value heads of 128), and whether each
variant's rows equal its own rows split into decode-sized launches (bits may differ between
variants; each must agree with itself)."""

import itertools
import json
import sys

import torch

import lanes.kernels.delta_rule as dr
from lanes.kernels.delta_rule import DeltaRuleWeights

torch.manual_seed(0)
dev = "cuda" if torch.cuda.is_available() else "cpu"
hk, hv, d, kernel = (16, 16, 128, 4) if dev == "cuda" else (2, 2, 32, 4)  # CPU: a dry run
conv_dim = 2 * hk * d + hv * d
w = DeltaRuleWeights(
    taps=torch.randn(conv_dim, kernel, device=dev) * 0.5,
    neg_a=-torch.rand(hv, device=dev),
    dt_bias=torch.randn(hv, device=dev),
    norm=(1 + 0.1 * torch.randn(d, device=dev)).bfloat16(),
    key_heads=hk, value_heads=hv, key_dim=d, value_dim=d, eps=1e-6,
)
T = int(sys.argv[1]) if len(sys.argv) > 1 else 8192
fused = torch.randn(T, conv_dim + hv * d + 2 * hv, device=dev).bfloat16()
mixed, z, b, a = fused.split([conv_dim, hv * d, hv, hv], dim=1)
conv = torch.randn(conv_dim, kernel - 1, device=dev)
state = torch.randn(hv, d, d, device=dev) * 0.1


def timed(fn, reps=3):
    if dev == "cpu":
        return 0.0
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e))
    return sorted(ts)[len(ts) // 2]


rows = []
base = None
for block_v, warps in itertools.product((32, 16, 8), (4, 2, 1)):
    dr._BLOCK_V, dr._WARPS = block_v, warps
    ms = timed(lambda: dr.gated_delta(mixed, z, b, a, conv, state, w))
    whole, c_end, s_end = dr.gated_delta(mixed[:64], z[:64], b[:64], a[:64], conv, state, w)
    c, s, parts = conv, state, []
    for lo, hi in ((0, 40), (40, 41), (41, 46), (46, 64)):
        out, c, s = dr.gated_delta(mixed[lo:hi], z[lo:hi], b[lo:hi], a[lo:hi], c, s, w)
        parts.append(out)
    split_equal = torch.equal(torch.cat(parts), whole) and torch.equal(s, s_end)
    decode_ms = timed(lambda: dr.gated_delta(mixed[:1], z[:1], b[:1], a[:1], conv, state, w), 20)
    if base is None:
        base = whole
    row = dict(block_v=block_v, warps=warps, prefill_ms=round(ms, 2), one_row_ms=round(decode_ms, 4),
               split_equal=split_equal, same_bits_as_32x4=torch.equal(whole, base))
    print(json.dumps(row), flush=True)
    rows.append(row)
print(json.dumps({"T": T, "rows": rows}))
