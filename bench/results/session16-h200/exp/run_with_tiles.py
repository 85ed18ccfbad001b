"""Run a bench module with q4_tiles' chosen tiles (argv[1]: its json; argv[2]: module; rest: args)."""
import json
import runpy
import sys

from lanes.kernels import packed_matmul as pm
sys.path.insert(0, ".exp")
import q4_tiles_table as tab  # noqa: E402

best = json.load(open(sys.argv[1]))["best"]
if best["few"]:
    pm.FEW_ROWS_TILES = tab.FEW[best["few"].split()[1]]
if best["pre"]:
    pm.PREFILL_TILES = tab.PRE[best["pre"].split()[1]]
print("tiles", pm.DECODE_TILES, pm.FEW_ROWS_TILES, pm.PREFILL_TILES, flush=True)
sys.argv = [sys.argv[2], *sys.argv[3:]]
runpy.run_module(sys.argv[0], run_name="__main__")
