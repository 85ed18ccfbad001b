import sys
sys.path.insert(0, ".exp")
from sass import compile_sm90, report
import importlib.util
spec = importlib.util.spec_from_file_location("oldmm", ".before/kernels/matmul.py")
old = importlib.util.module_from_spec(spec); sys.modules["oldmm"] = old; spec.loader.exec_module(old)
sig = {"x_ptr": "*bf16", "w_ptr": "*i32", "scale_ptr": "*bf16", "shift_ptr": "*bf16", "bias_ptr": "*bf16",
       "out_ptr": "*bf16", "part_ptr": "*fp32", "ticket_ptr": "*i32", "N": "i32", "K": "i32",
       "stride_xm": "i32", "stride_wn": "i32", "stride_sn": "i32", "SEG_K": "i32"}
const = dict(M=1, SPLIT=4, PARTIAL=True, HAS_BIAS=False, UPCAST=False, ROW_STABLE=False, PACKED=True, BITS=4,
             GROUP=64, BLOCK_M=16, BLOCK_N=64, BLOCK_K=64, PDL=False)
for k in const: sig[k] = "constexpr"
k = compile_sm90(old._matmul_kernel, sig, const)
import importlib; sys.path.insert(0, ".exp"); from sass_new import loop_counts
ops = loop_counts(k.asm["sass"]); print(sum(ops.values())/32, dict(ops.most_common(14))); s = k.asm["sass"]
open("/tmp/old.sass", "w").write(s)
