#!/usr/bin/env bash
# H200 call 3 (fourteenth session, straight after call 2 on the warm machine): bench_speed with
# gpt-fast in the same run (8B and SmolLM2 batch-1 decode, 8K prefill, exact and fast);
# per-kernel device time (PDL off) of the
# batch-1 decode steps and the 8K prefill; then issue 19: the 4-bit GEMV's launch variants and ncu on one 28672 x 4096 launch.
export PYTHONUNBUFFERED=1
LANES_PDL=0 timeout 100 python3 -m bench.profile_kernels --out $OUT/kernels-pdl0.json 2>&1 | tail -1 | cut -c1-300
python3 - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/kernels-pdl0.json"))
for k, v in d.items():
    if isinstance(v, dict) and "kernels" in v:
        print(k, round(v["device_ms"], 3), "ms")
        for n, e in list(v["kernels"].items())[:6]:
            print("   ", n[:40], round(e["us"], 1), "us", e["launches"])
PY
# (3) issue 19: the 4-bit GEMV's launch variants, and ncu on one 28672 x 4096 launch
PYTHONPATH=. timeout 90 python3 .exp/packed_sweep.py > $OUT/packed-sweep.jsonl 2>&1
python3 -c "
import json,sys
rs=[json.loads(l) for l in open('$OUT/packed-sweep.jsonl') if l.startswith('{')]
for s in ('qkv','gate_up'):
    ok=sorted((r for r in rs if r['shape']==s and 'us' in r), key=lambda r: r['us'])
    print(s, 'engine', [(r['us'], r['tbs']) for r in ok if r['engine']], 'best', [(r['bn'],r['split'],r['bk'],r['stages'],r['warps'],r['us'],r['tbs'],r['rows_ok']) for r in ok[:5]], 'n', len(ok), 'rows differ', sum(not r['rows_ok'] for r in ok))"
timeout 80 ncu --clock-control none -k regex:_matmul_kernel -s 2 -c 1 --section SpeedOfLight \
  --section WarpStateStats --section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis \
  --section MemoryWorkloadAnalysis --section InstructionStats python3 -c "
import torch
from lanes.kernels import matmul
from importlib.machinery import SourceFileLoader
ps = SourceFileLoader('ps', '.exp/packed_sweep.py').load_module()
gen = torch.Generator(device='cuda').manual_seed(0)
w = ps.packed(28672, 4096, 64, gen)
x = torch.randn((1, 4096), device='cuda', dtype=torch.bfloat16, generator=gen)
for _ in range(3):
    matmul.matmul(x, w)
torch.cuda.synchronize()
" > $OUT/ncu-packed.txt 2>&1
grep -E "Duration|Throughput|Stall|Registers|Shared Memory|Achieved Occ|Warp Cycles|Issued|Executed Ipc|Pipe|==PROF==|Error" $OUT/ncu-packed.txt | head -40
