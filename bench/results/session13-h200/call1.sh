#!/usr/bin/env bash
# H200 call 1 (thirteenth session): (1) the packed GGUF through the Triton ops on the GPU, with
# last session's int32-word fix (issue 19); (2) where an 8K prefill's TTFT goes that its kernels
# do not fill (trace_gaps --prefill, 8B shape); (3) prefill attention variants, timing only
# (.exp/attn_variants.py: the partition merge in the walk, fp fusion, stages, warps, rows);
# (4) ncu on one 8K prefill attention launch (stall reasons).
export PYTHONUNBUFFERED=1
pip install -q --no-deps --target /tmp/site .whl/gguf-*.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/site:.
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_gguf.py -k "packed or affine" \
  "tests/test_kernels.py::test_packed_matmul_rows_do_not_depend_on_m" 2>&1 | tee $OUT/tests.log \
  | grep -E "passed|failed|FAILED|Error" | tail -8
timeout 150 python3 -m bench.trace_gaps --prefill 8192 --out $OUT/trace-prefill-8k.json \
  > $OUT/trace-prefill.log 2>&1; tail -c 1500 $OUT/trace-prefill.log | head -40
timeout 200 python3 .exp/attn_variants.py 8192 32768 > $OUT/attn-variants.log 2>&1
grep -v '^ \|^{\|^}' $OUT/attn-variants.log | cut -c1-200
cat > /tmp/one.py <<'PY'
import torch
from bench.bench_attention import case
from lanes.kernels import attention
q, kc, vc, slots = case(8192, torch.Generator(device="cuda").manual_seed(1))
meta = attention.make_meta([(0, 8192, 8192, slots)], 4, q.device, 128)
for _ in range(2):
    attention.paged_attention(q, kc, vc, meta)
torch.cuda.synchronize()
PY
timeout 150 ncu --clock-control none -k regex:_paged_attention -s 1 -c 1 --section SpeedOfLight \
  --section WarpStateStats --section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis \
  --section MemoryWorkloadAnalysis python3 /tmp/one.py > $OUT/ncu-attn-8k.txt 2>&1
grep -E "Duration|Throughput|Stall|Registers|Shared Memory|Achieved Occ|Warp Cycles|Issued|Executed Ipc|Pipe|==PROF==|Error" $OUT/ncu-attn-8k.txt | head -40
