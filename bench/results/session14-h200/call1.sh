#!/usr/bin/env bash
# H200 call 1 (fourteenth session): (1) bench.exactness on HEAD (e901fc3: the batch's ids reach
# the device through numpy; exactness has not run on it); (2) the decode GEMV tiling sweep
# (.exp/gemv_sweep.py: block_n x split x block_k x stages at M = 1 with no weight in L2, rows
# checked against the prefill path; the prefill tiles' time per split at M = 8192).
export PYTHONUNBUFFERED=1
timeout 110 python3 -m bench.exactness --shape llama-3.1-8b --requests 6 --max-prompt 4096 \
  --modes exact --out $OUT/exactness-8b.json 2>&1 | grep -E "^(exact|fast)|Error|failed" | tail -4
PYTHONPATH=. timeout 420 python3 .exp/gemv_sweep.py qkv,o,down,gate_up,lm_head,s_qkv,s_o,s_gate_up,s_down,s_lm_head \
  > $OUT/sweep.jsonl 2> $OUT/sweep.err
tail -3 $OUT/sweep.err
python3 - <<'PY'
import json, os
rows = [json.loads(l) for l in open(os.environ["OUT"] + "/sweep.jsonl")]
by = {}
for r in rows:
    by.setdefault(r["shape"], []).append(r)
for name, rs in by.items():
    eng = [r for r in rs if r.get("engine") and "us" in r and "prefill_m" not in r]
    ok = sorted((r for r in rs if r.get("rows_ok") and "us" in r), key=lambda r: r["us"])[:3]
    print(name, "engine", [(r["bn"], r["split"], r["us"], r["tbs"]) for r in eng][:1],
          "best", [(r["bn"], r["split"], r["bk"], r.get("stages"), r.get("warps", 4), r["us"], r["tbs"]) for r in ok])
    print("  prefill", [(r["split"], r["us"]) for r in rs if "prefill_m" in r], [r for r in rs if "m" in r], [r["done_s"] for r in rs if "done_s" in r])
    bad = [r for r in rs if r.get("rows_ok") is False or "error" in r]
    if bad: print("  not ok", [(r["bn"], r["split"], r["bk"], r.get("error", "rows")[:40]) for r in bad][:8])
PY
