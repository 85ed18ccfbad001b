"""Session 16 call 3 (issue 19): which tiles for 17-64 rows and for prefill give every row the
bits of the M = 1 decode tile (call 2: block_m 16 variants agree among themselves, 64- and
128-row tiles and weight-left tiles of >= 64 columns do not)? Then prefill speed of those that
agree; writes the choice to argv[1]."""
import json
import sys
import time

import torch

from bench.bench_matmul import event_us
from lanes.kernels import matmul
from lanes.kernels import packed_matmul as pm
from lanes.packed import PackedWeight

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
          "down": (4096, 14336), "lm_head": (128256, 4096)}
T = pm.PackedTiles
FEW = {"m64w4": T(64, None, 4), "m64w2": T(64, None, 2), "m32w4": T(32, None, 4),
       "m16w4": T(16, None, 4), "m64n32L": T(64, 32, 4, True), "m32n64w2": T(32, 64, 2)}
PRE = {"m128n128w8": T(128, 128, 8), "m64n128w2": T(64, 128, 2), "m128n32Lw4": T(128, 32, 4, True),
       "m256n32Lw4": T(256, 32, 4, True), "m64n64w2": T(64, 64, 2), "m16n128w4": T(16, 128, 4),
       "m32n128w4": T(32, 128, 4), "m32n64w2": T(32, 64, 2), "m128n32Lw2": T(128, 32, 2, True)}

