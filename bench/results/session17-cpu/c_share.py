import time, statistics, collections
import lanes.kernels.packed_linear_cpu as plc, lanes.kernels.attention_cpu as ac, lanes.kernels.rows_cpu as rc
from lanes import EngineConfig, SamplingParams, build_engine
eng = build_engine(None, EngineConfig())
acc = collections.Counter(); calls = collections.Counter()
def wrap(name, fn):
    def w(*a):
        t = time.perf_counter(); r = fn(*a); acc[name] += time.perf_counter() - t; calls[name] += 1; return r
    return w
k = plc._kernel(); plc._kernel = lambda f=wrap("linear", k): f
k2 = ac._kernel(); ac._kernel = lambda f=wrap("attention", k2): f
lib = rc._lib()
class L: pass
l = L(); l.lanes_rms_norm = wrap("norm", lib.lanes_rms_norm); l.lanes_rope_write = wrap("rope", lib.lanes_rope_write)
rc._lib = lambda: l
dec = eng.runner.decoder
fwd = []
orig = dec.forward
def timed(batch, *a):
    t = time.perf_counter(); r = orig(batch, *a); fwd.append((batch.num_tokens, time.perf_counter() - t)); return r
dec.forward = timed
chat = [{"role": "user", "content": "Write a short poem about the sea."}]
p = SamplingParams(max_tokens=96, temperature=0.0, ignore_eos=True)
eng.generate([chat], p)
acc.clear(); calls.clear(); fwd.clear()
t = time.perf_counter(); out = eng.generate([chat], p)[0]; wall = time.perf_counter() - t
n = len(out.token_ids)
dec_fwd = [d for m, d in fwd if m == 1]
print(f"{n/wall:.1f} tok/s; wall per token {wall/n*1e3:.2f} ms; decode forward median {statistics.median(dec_fwd)*1e3:.2f} ms")
for k_, v in acc.items():
    print(f"  C {k_:10s} {v/n*1e3:.2f} ms/token ({calls[k_]//n} calls)")
