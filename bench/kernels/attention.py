"""Prefill attention: the batch-invariant paged kernel on one long prompt (the 8B shape's heads:
32 query heads over 8 KV heads, head_dim 128, bf16; 16-slot blocks scattered over the pool),
per tile layout (rows per program, pipeline stages), against PyTorch SDPA on contiguous K/V;
and whether the prompt's last rows have the bits a decode step (1 query) and a 37-query chunk
give them.

    python -m bench.kernels.attention [--lengths 8192 32768] [--out FILE]
    python -m bench.kernels.attention --decode [--lengths 512 2048 8192 32768] [--lanes 1 8]

`--decode`: decode (1 query) and verify (5 queries) steps instead, every lane with the whole
context, timed as graph replays: µs per call and the K/V bytes read per second.

`--chunks`: a prompt chunk of 16-256 queries at the end of each length's context, alone and
beside 63 decode lanes of 160 positions (a mixed round's forward), with its key partitions
split over programs or walked by one program per query tile: µs per call as graph replays, and
whether the two give the same bits.

`--baseline` times only the layout the engine takes (rows_for), with the arguments every version
of kernels/attention.py since the ninth session takes (for a before/after run of an older tree).
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from bench.kernels.matmul import event_us, graph_us
from lanes.kernels import attention

HQ, HKV, D, BLOCK = 32, 8, 128, 16
# (rows per program, num_stages, key tile)
VARIANTS = [
    (64, None, 64),
    (128, None, 64),
    (128, 3, 64),
    (128, 4, 64),
    (128, 3, 128),
    (64, 3, 128),
]


def case(length: int, gen: torch.Generator):
    blocks = torch.randperm(length // BLOCK, generator=gen, device="cuda")
    slots = (blocks[:, None] * BLOCK + torch.arange(BLOCK, device="cuda")).reshape(-1)

    def rand(*shape):
        return torch.randn(shape, generator=gen, device="cuda", dtype=torch.bfloat16)

    return rand(length, HQ, D), rand(length, HKV, D), rand(length, HKV, D), slots


def run(q, kc, vc, slots, first: int, rows: int | None, stages: int | None, block_n: int = 64):
    """Queries first..length-1 of the prompt, their context the whole prefix."""
    length = slots.shape[0]
    seqs = [(0, length - first, length, slots)]
    group = HQ // HKV
    if rows is None:  # --baseline: the layout the engine takes, arguments every tree has
        layout = attention.rows_for(length - first, q.dtype, q.device)
        return attention.paged_attention(
            q[first:].contiguous(), kc, vc, attention.make_meta(seqs, group, q.device, layout)
        )
    meta = attention.make_meta(seqs, group, q.device, rows)
    return attention.paged_attention(
        q[first:].contiguous(), kc, vc, meta, num_stages=stages, block_n=block_n
    )


def length_row(length: int, baseline: bool) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(length)
    q, kc, vc, slots = case(length, gen)
    # SDPA on contiguous K/V in position order, the KV heads repeated for each query group
    flops = 4 * HQ * D * length * length / 2  # causal: half of QK^T and PV
    k = kc[slots].transpose(0, 1).repeat_interleave(HQ // HKV, 0)[None]
    v = vc[slots].transpose(0, 1).repeat_interleave(HQ // HKV, 0)[None]
    qs = q.transpose(0, 1)[None]
    sdpa_us = event_us(lambda: F.scaled_dot_product_attention(qs, k, v, is_causal=True), 5)
    row = {"sdpa_us": sdpa_us, "sdpa_tflops": flops / sdpa_us / 1e6}
    variants = [(None, None, 64)] if baseline else VARIANTS
    for rows, stages, block_n in variants:
        key = "baseline" if rows is None else f"rows={rows} stages={stages} keys={block_n}"
        try:
            out = run(q, kc, vc, slots, 0, rows, stages, block_n)
            us = event_us(lambda r=rows, s=stages, b=block_n: run(q, kc, vc, slots, 0, r, s, b), 5)
            # a decode step's row and a 37-query chunk's rows, in the default layout
            decode_rows = None if baseline else run(q, kc, vc, slots, length - 1, 64, None, block_n)
            chunk_rows = None if baseline else run(q, kc, vc, slots, length - 37, 64, None, block_n)
        except Exception as e:  # out of shared memory, etc.
            row[key] = {"error": str(e)[:160]}
            continue
        entry = {"us": us, "tflops": flops / us / 1e6}
        if decode_rows is not None:
            entry["last_row_equals_decode"] = bool(torch.equal(out[-1:], decode_rows))
            entry["last_37_equal_chunk"] = bool(torch.equal(out[-37:], chunk_rows))
        ref = F.scaled_dot_product_attention(qs, k, v, is_causal=True)[0].transpose(0, 1)
        entry["max_abs_vs_sdpa"] = float((out.float() - ref.float()).abs().max())
        row[key] = entry
    return row


def decode_row(length: int, lanes: int, queries: int) -> dict:
    """One decode/verify step of `lanes` lanes, each with `length` positions of context."""
    gen = torch.Generator(device="cuda").manual_seed(length + lanes)
    q, kc, vc, slots = case(length * lanes, gen)
    q = q[: lanes * queries].contiguous()
    seqs = [
        (i * queries, queries, length, slots[i * length : (i + 1) * length]) for i in range(lanes)
    ]
    meta = attention.make_meta(seqs, HQ // HKV, q.device)
    us = graph_us(lambda: attention.paged_attention(q, kc, vc, meta))
    kv_bytes = lanes * length * HKV * D * 2 * kc.element_size()
    row = {"us": us, "kv_tb_per_s": kv_bytes / us / 1e6}
    if lanes * HKV >= attention.SPLIT_BELOW_PROGRAMS:  # not split by default: what splitting gives
        row["us_split"] = graph_us(lambda: attention.paged_attention(q, kc, vc, meta, split=True))
    return row


def chunk_row(length: int, chunk: int, decoders: int) -> dict:
    """A chunk's last `chunk` queries at context `length`, and `decoders` decode lanes of 160
    positions before it in the same call (the decode rows first, as a mixed round has them)."""
    gen = torch.Generator(device="cuda").manual_seed(length + chunk)
    q, kc, vc, slots = case(length + 160 * decoders, gen)
    chunk_slots, rest = slots[:length], slots[length:]
    seqs = [(i, 1, 160, rest[i * 160 : (i + 1) * 160]) for i in range(decoders)]
    seqs.append((decoders, chunk, length, chunk_slots))
    q = q[: decoders + chunk].contiguous()
    meta = attention.make_meta(seqs, HQ // HKV, q.device)
    split = attention.paged_attention(q, kc, vc, meta, split=True)
    walked = attention.paged_attention(q, kc, vc, meta, split=False)
    return {
        "us_default": graph_us(lambda: attention.paged_attention(q, kc, vc, meta)),
        "us_split": graph_us(lambda: attention.paged_attention(q, kc, vc, meta, split=True)),
        "us_one_program_per_tile": graph_us(
            lambda: attention.paged_attention(q, kc, vc, meta, split=False)
        ),
        "split_equals_walked": bool(torch.equal(split, walked)),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", type=int, nargs="+", default=[8192, 32768])
    ap.add_argument("--baseline", action="store_true")
    ap.add_argument("--decode", action="store_true", help="decode and verify steps instead")
    ap.add_argument("--lanes", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--chunks", action="store_true", help="prompt chunks deep in a context")
    ap.add_argument("--out", default="bench/results/attention-h200.json")
    args = ap.parse_args()
    report = {"device": torch.cuda.get_device_name(), "heads": [HQ, HKV, D], "lengths": {}}
    # (report key, what the log line starts with, the row's function and its arguments)
    if args.chunks:
        cases = [
            (f"{n} chunk={c} decoders={d}", (n, c, d), chunk_row, (n, c, d))
            for n in args.lengths
            for c in (16, 80, 256)
            for d in (0, 63)
        ]
    elif args.decode:
        cases = [
            (f"{n} lanes={lanes} queries={q}", (n, lanes, q), decode_row, (n, lanes, q))
            for n in args.lengths
            for lanes in args.lanes
            for q in (1, 5)
        ]
    else:
        cases = [(str(n), (n,), length_row, (n, args.baseline)) for n in args.lengths]
    for key, shown, row_of, row_args in cases:
        row = row_of(*row_args)
        report["lengths"][key] = row
        print(*shown, json.dumps(row), flush=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
