#!/usr/bin/env bash
# H200 call 4: c64 round by round (4 greedy runs, 1 seeded), and greedy vs seeded decode in the
# engine after the kernel's per-slot passes.
export PYTHONUNBUFFERED=1
timeout 240 python3 -m bench.c64_rounds --runs 4 --seeded-runs 1 --out $OUT/c64-rounds.json
timeout 150 python3 -m bench.bench_sampling --part engine --out $OUT/engine-after.json
