# call 5: the occasional 4-5 ms host gaps in steady decode at 64 lanes (calls 3-4: 0.3-0.5 gaps
# over 20 us per step, 1.4-2.1 ms per step): which host ops run during them; and the same busy
# profile with Python's garbage collector off, to test that suspect
export PYTHONUNBUFFERED=1
timeout 150 python -m bench.trace_gaps --lanes 64 --context 700 --steps 30 --out $OUT/trace-gaps-64.json 2>&1 | head -40
timeout 120 python -c "import gc, runpy; gc.disable(); runpy.run_module('bench.profile_busy', run_name='__main__')" \
  --shapes llama-3.1-8b --overlap on --out $OUT/busy-gc-off.json 2>&1 | grep lanes=
