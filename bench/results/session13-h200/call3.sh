#!/usr/bin/env bash
# H200 call 3 (thirteenth session), experiments only (.exp/): the prefill down projection with
# silu(gate) * up made in its prologue from TMA-loaded tiles (time, bits against silu_mul + the
# tiles); add_rms_norm at 4 / 8 / 16 warps; registers and spills of prefill attention variants.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 200 python3 .exp/glu_tiles.py 2>&1 | tee $OUT/glu-tiles.log | tail -9
timeout 100 python3 .exp/norm_warps.py 2>&1 | tee $OUT/norm-warps.log | tail -6
timeout 120 python3 .exp/attn_regs.py 2>&1 | tee $OUT/attn-regs.log | tail -6
