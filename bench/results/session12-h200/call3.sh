#!/usr/bin/env bash
# H200 call 3 (twelfth session, issue 17): the committed tree (78ae4c9: ticket merge, early exit,
# layout before the PDL wait; no gated prologue) against HEAD-before (0518af5, .before/), and
# the 64-lane question: 8510083 (.s11/) ran 5.1 ms of device time per step, 0518af5 6.7-7.7.
export PYTHONUNBUFFERED=1
for tree in .before .; do
  tag=$( [ $tree = . ] && echo after || echo before )
  (cd $tree && timeout 120 python3 -m bench.profile_busy --overlap on \
    --out $OUT/busy-$tag.json 2>&1 | grep "lanes=" | cut -c1-200)
done
for tree in .s11 .; do
  tag=$( [ $tree = . ] && echo after || echo s11 )
  (cd $tree && LANES_PDL=0 timeout 90 python3 -m bench.profile_busy --overlap on \
    --shapes llama-3.1-8b --out $OUT/busy-pdl0-$tag.json 2>&1 | grep "lanes=" | cut -c1-200)
done
timeout 60 python3 -m bench.bench_attention --decode --lengths 700 2048 --lanes 16 64 \
  --out $OUT/attn-decode-64.json 2>&1 | tail -8
timeout 260 python3 -m bench.bench_speed --peers .peers --skip-32k --repeats 2 > $OUT/speed.log 2>&1
grep -E "tok/s|ratio|prefill|gpt" $OUT/speed.log | head -20; cp bench/results/speed-*.json $OUT/ 2>/dev/null; ls bench/results | grep speed
