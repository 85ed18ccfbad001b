# H200 call 2 of 4: the GGUF assembled; the target writes 12,288 everyday prompts and answers
# them (+ 4,096 corpus prompts), kept in /root/keep and sent back.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site LANES_CACHE=/root/keep/cache HF_HUB_OFFLINE=1
G=$LANES_CACHE/SmolLM2-135M-Instruct.Q4_1.gguf
cat /root/keep/part-aa .gg2/part-ab .gg2/part-ac > $G || exit 1
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $G" | sha256sum -c || exit 1
timeout 560 python3 -m lanes.cli distill --device cuda --out /root/keep/out --prompts 8192 \
  --answered 4096 --held-out 16 --everyday 12288 --everyday-file /root/keep/everyday.json \
  --answers /root/keep/answers.jsonl.gz --answers-only --new-tokens 128 --teacher-batch 1024 \
  --max-teacher-seconds 230 2>&1 | grep -v "it/s\]" | tail -8
cp /root/keep/everyday.json /root/keep/answers.jsonl.gz $OUT/; ls -la $OUT
