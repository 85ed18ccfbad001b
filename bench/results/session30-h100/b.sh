#!/usr/bin/env bash
# issue 41: c0dc8c2 at load with the shipped head (never measured on a GPU), then the teacher's
# data for a stronger head: 12,288 more everyday prompts beside the shipped run's, and answers
export PYTHONUNBUFFERED=1 LANES_CACHE=/root/keep/cache PYTHONPATH=$PWD/.gpu/py
mkdir -p /root/keep/cache
[ -s /root/keep/cache/SmolLM2-135M-Instruct.Q4_1.gguf ] || cat /root/keep/gpart.aa .gpu/p2/gpart.ab .gpu/p2/gpart.ac | gunzip > /root/keep/cache/SmolLM2-135M-Instruct.Q4_1.gguf
sha256sum /root/keep/cache/*.gguf | tee $OUT/sha.txt
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/gpu.txt
lanes() { python -c "import sys; from lanes.cli import main; sys.exit(main())" "$@"; }
timeout 240 python -m bench.drafters concurrency --device cuda --concurrency 1,4,16,64 --prompts 32 \
  --new-tokens 96 --passes 2 --warm > $OUT/load-shipped.log 2>&1
cp bench/results/drafters-concurrency-cuda.json $OUT/load-shipped.json
grep -v "INFO:lanes:device rounds" $OUT/load-shipped.log | tail -8
zcat bench/results/distill-h200-everyday/everyday-prompts.json.gz > /root/keep/everyday.json
timeout 300 python -c "import sys; from lanes.cli import main; sys.exit(main())" distill \
  --device cuda --out /root/keep/head-new --everyday 24576 \
  --everyday-file /root/keep/everyday.json --prompts 8192 --answered 4096 \
  --answers /root/keep/answers.jsonl.gz --answers-only --max-teacher-seconds 120 > $OUT/teacher.log 2>&1
tail -4 $OUT/teacher.log; ls -l /root/keep
cp /root/keep/everyday.json $OUT/ 2>/dev/null; gzip $OUT/everyday.json 2>/dev/null
