"""Compile a Triton kernel for sm_90 here (no GPU) and count SASS instructions by opcode."""
import collections
import re
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


def compile_sm90(fn, signature, constexprs, num_warps=4):
    aligned = [n for n, t in signature.items() if t.startswith("*") or n in ("N", "K", "SEG_K") or n.startswith("stride")]
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    src = ASTSource(fn, signature, constexprs, attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})


def opcode_counts(sass: str):
    ops = collections.Counter()
    for line in sass.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
        if m:
            ops[m.group(1).split(".")[0]] += 1
    return ops


def report(k, name):
    sass = k.asm["sass"]
    ops = opcode_counts(sass)
    print(name, "regs", re.search(r"\.maxnreg|REG:(\d+)", "") and "?" or k.asm.get("ptx","").count(".reg"), "total", sum(ops.values()))
    print("  ", dict(ops.most_common(25)))
    return sass
