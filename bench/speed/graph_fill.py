"""Host time of refilling a CUDA graph's static inputs for one decode replay (`DecodeGraphs._fill`),
on the CPU: 64 lanes at a long context, each replay one token further. Compares the incremental
refill (only slots that changed) with a whole-context refill (every row forgotten first, which is
what every replay did before).

    python -m bench.speed.graph_fill [--lanes 64] [--context 2048] [--steps 50]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from lanes.cache.block_table import BlockTable
from lanes.graphs import DecodeGraphs, _Graph


@dataclass
class _Lane:
    request_id: int
    block_table: BlockTable
    tokens: list[int]

    def token_ids(self, start: int, end: int) -> list[int]:
        return self.tokens[start:end]


@dataclass
class _Step:
    lane: _Lane
    start: int
    end: int
    features = None

    def token_ids(self) -> list[int]:
        return self.lane.token_ids(self.start, self.end)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lanes", type=int, default=64)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--out", default="bench/results/graph-fill-cpu.json")
    args = ap.parse_args()
    bs = 16
    max_ctx = args.context + args.steps + bs
    graphs = DecodeGraphs.__new__(DecodeGraphs)  # only _fill's inputs: no model, no GPU
    graphs.scratch_slot = args.lanes * (max_ctx // bs + 1) * bs
    lanes = []
    for i in range(args.lanes):
        table = BlockTable(bs)
        table.append([i * (max_ctx // bs + 1) + b for b in range(max_ctx // bs + 1)])
        lanes.append(_Lane(i, table, [7] * max_ctx))
    result = {}
    for mode in ("whole-context", "incremental"):
        g = _Graph(args.lanes, 1, max_ctx, 4, "cpu")
        times = []
        for step in range(args.steps):
            end = args.context + step + 1
            steps = [_Step(lane, end - 1, end) for lane in lanes]
            if mode == "whole-context":
                g.rows = [None] * args.lanes
            start = time.perf_counter()
            graphs._fill(g, steps)
            times.append(time.perf_counter() - start)
        result[mode] = {"median_ms": statistics.median(times[1:]) * 1e3}
    result.update(lanes=args.lanes, context=args.context, steps=args.steps, device="cpu")
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    for mode in ("whole-context", "incremental"):
        print(f"{mode:14} {result[mode]['median_ms']:.3f} ms per replay")


if __name__ == "__main__":
    main()
