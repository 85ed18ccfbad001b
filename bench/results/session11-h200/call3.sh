#!/usr/bin/env bash
# H200 call 3: the packed 4-bit GEMV under ncu (issue 19: why ~30x slower than its bytes);
# 8B decode steps before/after the key partitions (issue 17); the MoE shape's decode (issue 18).
export PYTHONUNBUFFERED=1
timeout 100 ncu --clock-control none -k regex:_matmul_kernel -s 23 -c 1 --section SpeedOfLight \
  --section Occupancy --section LaunchStats --section WarpStateStats --section SourceCounters \
  --section MemoryWorkloadAnalysis python3 -m bench.packed_gemv > $OUT/ncu-packed.txt 2>&1
grep -E "packed4|bf16 n|Duration|DRAM Throughput|Registers|Achieved Occupancy|Grid Size|Stall|stall|Local" $OUT/ncu-packed.txt | head -30
for tree in .before .; do
  (cd $tree && timeout 80 python3 -m bench.profile_busy --overlap on --shapes llama-3.1-8b \
    --out $OUT/busy-8b-$( [ $tree = . ] && echo after || echo before ).json 2>&1 | grep "lanes=" )
done
timeout 150 python3 -m bench.bench_hybrid --shape qwen3-30b-a3b-like --repeats 2 --prefill 2048 \
  --skip-hf 2>&1 | tail -12 > $OUT/hybrid-moe.log; cat $OUT/hybrid-moe.log
