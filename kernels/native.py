"""C kernels for the CPU, built at first use with the machine's C compiler (`$CC`, else cc, gcc
or clang) and cached under $LANES_CACHE/native, keyed by the source, the compiler and the CPU.

No build step at install time and no extra dependency: the source ships beside this module, a
build takes about a second, and without a compiler `load` returns None and the callers keep the
torch path (saying so once in the log). `-march=native` tunes the code to this machine, which is
why the CPU's flags are part of the key (a shared home directory may see other machines).
OpenMP threads come from the runtime torch has already loaded (the same `libgomp.so.1` soname),
so the kernels and torch's own ops share one pool of workers.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

from lanes.config import cache_dir

SOURCES = Path(__file__).resolve().parent
CPU_SOURCES = ("packed_linear_cpu.c", "attention_cpu.c", "rows_cpu.c")  # exact mode's C kernels
_FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-shared", "-fPIC", "-Wno-psabi")
log = logging.getLogger("lanes")


def compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    return None


@functools.cache  # asked once for all the kernels' keys
def _version(cc: str) -> str:
    return subprocess.run([cc, "--version"], capture_output=True, text=True).stdout


@functools.cache
def _cpu_identity() -> str:
    try:  # x86 "flags", arm "Features": the instruction sets -march=native picks from
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return next((ln for ln in lines if ln.startswith(("flags", "Features"))), "")
    except OSError:
        return platform.processor()


@functools.cache
def load(source: str) -> ctypes.CDLL | None:
    """The shared library built from kernels/<source> (a C file), or None where it cannot be
    built here. $LANES_NATIVE=0 turns native kernels off (the torch path then serves)."""
    if os.environ.get("LANES_NATIVE", "1") == "0":
        return None
    cc = compiler()
    if cc is None:
        log.warning("no C compiler found: the CPU serves packed weights on the slower torch path")
        return None
    try:  # the source and the headers it may include
        code = b"".join(f.read_bytes() for f in [SOURCES / source, *sorted(SOURCES.glob("*.h"))])
    except OSError as e:
        log.warning("%s: the torch path serves instead", e)
        return None
    key = hashlib.sha256(
        b"\0".join(s.encode() if isinstance(s, str) else s for s in
                   (code, _version(cc), _cpu_identity(), " ".join(_FLAGS), platform.machine()))
    ).hexdigest()[:16]  # fmt: skip
    target = cache_dir() / "native" / f"{Path(source).stem}-{key}.so"
    if not target.exists():
        _build(cc, SOURCES / source, target)
    if not target.exists():
        return None
    try:
        return ctypes.CDLL(str(target))
    except OSError as e:  # a library this machine cannot load (copied from another, say)
        log.warning("loading %s failed (%s); the torch path serves instead", target, e)
        return None


def _build(cc: str, source: Path, target: Path) -> None:
    """Compile with OpenMP where the compiler has it, else single-threaded; write the library
    under a temporary name and rename it, so a concurrent build never loads half a file."""
    target.parent.mkdir(parents=True, exist_ok=True)
    errors = ""
    for extra in (("-fopenmp",), ()):
        with tempfile.NamedTemporaryFile(dir=target.parent, suffix=".so", delete=False) as tmp:
            partial = Path(tmp.name)
        done = subprocess.run(
            [cc, *_FLAGS, *extra, "-o", str(partial), str(source), "-lm"],
            capture_output=True,
            text=True,
        )
        if done.returncode == 0:
            if not extra:
                log.warning("%s built without OpenMP: the CPU kernels run on one thread", cc)
            partial.replace(target)
            return
        partial.unlink(missing_ok=True)
        errors = done.stderr.strip()
    log.warning("building %s failed; the torch path serves instead:\n%s", source.name, errors)
