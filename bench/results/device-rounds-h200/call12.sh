#!/usr/bin/env bash
# H200 call 12 (GGUF still on the machine from call 10-11, else it stops): why the cost rule
# pauses device rounds that pay: its inputs, logged, over 4 everyday prompts.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site LANES_CACHE=/root/keep/cache HF_HUB_OFFLINE=1
test -f $LANES_CACHE/SmolLM2-135M-Instruct.Q4_1.gguf || { echo "no gguf"; exit 1; }
S=$PWD/drafter/weights/smollm2-135m-instruct
timeout 200 python3 - $S <<'PY' 2>&1 | grep -v Warning | tail -40
import logging, sys, time
logging.basicConfig(level=logging.INFO, format="%(message)s")
from lanes import EngineConfig, SamplingParams, build_engine
from bench.drafter_acceptance import everyday_prompts
chats = [m for _, m in everyday_prompts()][:6]
e = build_engine(None, EngineConfig(device="cuda", drafter=sys.argv[1] + "+ngram"))
p = SamplingParams(max_tokens=96, ignore_eos=True)
for c in chats:
    t = time.perf_counter(); (o,) = e.generate([c], p); dt = time.perf_counter() - t
    dc, rc = e.device_costs, e.draft_costs
    print(f"req {o.request_id}: {len(o.token_ids)/o.num_target_steps:.2f} tok/step, {dt*1e3:.0f} ms, device rounds {e.device_rounds.num_rounds}, dev tokens {dc.tokens} s {dc.seconds} n {dc.samples}, forward {rc.forward}")
PY
