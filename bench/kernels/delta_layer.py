"""One gated-DeltaNet layer's recurrence over a prompt: the recurrent kernel, the chunked one
(kernels/chunked_delta.py) and flash-linear-attention's chunk_gated_delta_rule where it is
installed, the same inputs, CUDA-event medians; then the chunked form's bits across forward
splits on this device (issue 45 item 1).

    python -m bench.kernels.delta-layer [--shape qwen3.5-2b-like] [--tokens 2048,8192,32768]
        [--repeats 5] [--out FILE]

Random inputs of the shape's head layout (bf16 projections, a 4-tap conv), one lane, a zero
start state. Times: `recurrent` and `chunked` are the whole rule as the model calls it (conv,
norms, gates, the rule, the gated RMSNorm); `chunked core` is the chunk and scan kernels
alone, which is what flash-linear-attention's call covers (q, k, v, g, beta given).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import time
from pathlib import Path

import torch

from bench.kernels.matmul import event_us
from bench.shapes import SHAPES


def _inputs(cfg, tokens: int, device: str):
    """(mixed, z, b, a, conv, state, w) for one lane of `tokens` rows: the kernel registry's
    random layer and rows at the shape's head layout, bf16, zero conv window and state."""
    from lanes.kernels.registry import _delta_rows, _delta_weights

    gen = torch.Generator().manual_seed(0)
    hk, hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv, kernel = cfg.linear_key_head_dim, cfg.linear_value_head_dim, cfg.linear_conv_kernel
    if dk != dv:
        raise SystemExit(
            f"{cfg.family}: dk {dk} != dv {dv}; the registry's random layers take one head size"
        )
    w = _delta_weights(torch.bfloat16, device, gen, hk=hk, hv=hv, d=dk, kernel=kernel)
    mixed, z, b, a = _delta_rows(w, tokens, torch.bfloat16, device, gen)
    conv = torch.zeros((w.taps.shape[0], kernel - 1), device=device)
    state = torch.zeros((hv, dk, dv), device=device)
    return mixed, z, b, a, conv, state, w


def _fla_us(q, k, v, beta, g, repeats: int) -> float | None:
    if importlib.util.find_spec("fla") is None:
        return None
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    args = [x[None].to(torch.bfloat16) for x in (q, k, v)] + [
        g[None],
        beta[None].to(torch.bfloat16),
    ]

    def run():
        chunk_gated_delta_rule(*args, scale=1.0, output_final_state=True)

    return event_us(run, repeats)


def _bits_across_splits(mixed, z, b, a, conv, state, w) -> dict:
    """The chunked form's rows in one forward against prompt chunks ending anywhere, decode
    rows one at a time and a verify span over a chunk boundary: mismatching rows (want 0)."""
    from lanes.kernels.chunked_delta import CHUNK, ChunkCarry, chunked_gated_delta

    rows = 3 * CHUNK + 10
    start = ChunkCarry.start(conv, state)
    whole, _ = chunked_gated_delta(mixed[:rows], z[:rows], b[:rows], a[:rows], start, w)
    cuts, outs, carry, begin = [37, 100, 101, 102, 190, 195, rows], [], start, 0
    for end in cuts:
        out, carry = chunked_gated_delta(
            mixed[begin:end], z[begin:end], b[begin:end], a[begin:end], carry, w
        )
        outs.append(out)
        begin = end
    split = torch.cat(outs)
    differ = (split != whole).flatten(1).any(dim=1)
    return {"rows": rows, "cuts": cuts, "mismatching_rows": int(differ.sum())}


def _times(cfg, tokens: int, device: str, repeats: int) -> dict:
    from lanes.kernels import chunked_delta
    from lanes.kernels.delta_rule import gated_delta

    mixed, z, b, a, conv, state, w = _inputs(cfg, tokens, device)
    carry = chunked_delta.ChunkCarry.start(conv, state)
    recurrent = event_us(lambda: gated_delta(mixed, z, b, a, conv, state, w), repeats)
    chunked = event_us(lambda: chunked_delta.chunked_gated_delta(mixed, z, b, a, carry, w), repeats)
    q, k, v, beta, g = chunked_delta.ref_features(mixed, b, a, conv, w)
    span = chunked_delta.span_rows(carry, q, k, v, beta, g)
    whole = tokens // chunked_delta.CHUNK
    core = event_us(lambda: chunked_delta.chunks_forward(*span, state, whole), repeats)
    out_c, _ = chunked_delta.chunked_gated_delta(mixed, z, b, a, carry, w)
    out_r, _, _ = gated_delta(mixed, z, b, a, conv, state, w)
    fla = _fla_us(q, k, v, beta, g, repeats)
    return {
        "tokens": tokens,
        "recurrent_ms": recurrent / 1e3,
        "chunked_ms": chunked / 1e3,
        "chunked_core_ms": core / 1e3,
        "fla_ms": None if fla is None else fla / 1e3,
        "max_abs_diff_vs_recurrent": (out_c.float() - out_r.float()).abs().max().item(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="qwen3.5-2b-like")
    parser.add_argument("--tokens", default="2048,8192,32768")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    cfg, device = SHAPES[args.shape], "cuda"
    result = {"shape": args.shape, "device": torch.cuda.get_device_name(), "rows": []}
    for tokens in (int(t) for t in args.tokens.split(",")):
        row = _times(cfg, tokens, device, args.repeats)
        result["rows"].append(row)
        print(json.dumps(row), flush=True)
    result["bits"] = _bits_across_splits(*_inputs(cfg, 512, device))
    print(json.dumps(result["bits"]))
    result["time"] = time.strftime("%Y-%m-%d %H:%M:%S")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
