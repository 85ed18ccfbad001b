"""The CPU path needs no Triton (it has no macOS wheels; pyproject asks for it on Linux only):
with every `triton` import refused, lanes loads a model and generates; a kernel launch would say
Triton is missing instead of crashing at import."""

from __future__ import annotations

import subprocess
import sys

BLOCK = """
import importlib.abc, sys
class NoTriton(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "triton" or name.startswith("triton."):
            raise ImportError("no triton on this machine")
sys.meta_path.insert(0, NoTriton())
"""


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK + code], capture_output=True, text=True)


def test_generation_on_the_cpu_without_triton(llama_dir):
    code = (
        "from lanes import build_engine, SamplingParams\n"
        "import lanes.kernels.triton_shim as shim\n"
        f"engine = build_engine({str(llama_dir)!r})\n"
        "out = engine.generate(['The quick'], SamplingParams(max_tokens=4))[0]\n"
        "print(shim.AVAILABLE, len(out.token_ids))\n"
        "from lanes.kernels.rmsnorm import _add_rms_norm_kernel as k\n"
        "try:\n    k[(1,)]()\nexcept RuntimeError as e:\n    print('launch:', e)\n"
    )
    result = run(code)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert lines[0] == "False 4" and "Triton is not installed" in lines[1]


def test_negative_control_a_plain_triton_import_fails_there():
    assert run("import triton").returncode != 0
