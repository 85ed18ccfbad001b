import re, collections, sys
sys.path.insert(0, ".exp")
from sass import compile_sm90
from lanes.kernels import packed_matmul as pm

def loop_counts(sass):
    s = sass.splitlines(); labels = {}
    for i, l in enumerate(s):
        m = re.match(r"^(LBB\w+):", l.strip())
        if m: labels[m.group(1)] = i
    best = None
    for i, l in enumerate(s):
        m = re.search(r"BRA (LBB\w+)", l)
        if m and m.group(1) in labels and labels[m.group(1)] < i:
            ops = collections.Counter()
            for b in s[labels[m.group(1)]:i+1]:
                mm = re.match(r"^[-\dA-Za-z:]*\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", b.strip())
                if mm: ops[mm.group(1)] += 1
            if best is None or sum(ops.values()) > sum(best.values()): best = ops
    return best

def main():
    sig = {"x_ptr": "*bf16", "w_ptr": "*u8", "scale_ptr": "*bf16", "shift_ptr": "*bf16", "bias_ptr": "*bf16",
           "out_ptr": "*bf16", "part_ptr": "*fp32", "ticket_ptr": "*i32", "N": "i32", "K": "i32",
           "stride_xm": "i32", "stride_wn": "i32", "stride_sn": "i32", "SEG_K": "i32"}
    for paired in (False, True):
        for bn, bk, left, group, warps, bits in [(64, 64, False, 64, 4, 4), (64, 64, True, 64, 4, 4), (32, 64, False, 64, 4, 4), (32, 64, True, 64, 4, 4),
     (128, 64, True, 64, 4, 4), (128, 64, False, 64, 4, 4), (64, 64, False, 64, 4, 8)]:
            const = dict(M=1, SPLIT=4, PARTIAL=True, HAS_BIAS=False, UPCAST=False, ROW_STABLE=False, BITS=bits,
                         GROUP=group, BLOCK_M=16, BLOCK_N=bn, BLOCK_K=bk, WEIGHT_LEFT=left, PDL=False, PAIRED=paired and bits == 4)
            sg = dict(sig); sg.update({k: "constexpr" for k in const})
            k = compile_sm90(pm._packed_matmul_kernel, sg, const, warps)
            ops = loop_counts(k.asm["sass"])
            weights = bn * bk / (32 * warps)
            open(f"/tmp/new_{bn}_{bk}_{left}_{group}_{bits}.sass", "w").write(k.asm["sass"])
            print(f"{'paired ' if paired else ''}bn{bn} bk{bk} {'L' if left else 'R'} g{group} b{bits}: {sum(ops.values())} instr/iter, {sum(ops.values())/weights:.1f}/weight;",
                  dict(ops.most_common(14)))

if __name__ == "__main__":
    main()
