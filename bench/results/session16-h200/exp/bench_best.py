"""Run bench.bench_packed with the sweep's best decode tiles (argv[1]: the sweep's json)."""
import json
import re
import sys

from lanes.kernels import packed_matmul as pm

best = json.load(open(sys.argv[1]))["best"]
bn, side, warps = re.fullmatch(r"bn(\w+?)([LR])w(\d+)", best).groups()
tiles = pm.PackedTiles(16, None if bn == "None" else int(bn), int(warps), side == "L")
print("decode tiles", tiles, flush=True)
pm.DECODE_TILES = tiles
sys.argv = ["bench_packed", *sys.argv[2:]]
from bench import bench_packed  # noqa: E402

bench_packed.main()
