"""Triton where it is installed; where it is not (macOS has no Triton wheels, and the CPU path
needs none), stand-ins that let the kernels' modules load — `@triton.jit` functions, `tl.constexpr`
annotations, the launchers' `triton.cdiv` — and that fail with a clear message if a kernel is ever
launched. Kernels import `triton` and `tl` from here."""

from __future__ import annotations

try:
    import triton
    import triton.language as tl

    AVAILABLE = True
except ImportError:
    AVAILABLE = False

    class _Anything:
        """What triton.language is used as while a module loads: attributes, calls, types."""

        def __getattr__(self, name: str) -> _Anything:
            return _Anything()

        def __call__(self, *args, **kwargs) -> _Anything:
            return _Anything()

    class _Kernel:
        def __init__(self, fn) -> None:
            self.fn = fn

        def _missing(self, *args, **kwargs):
            raise RuntimeError(
                f"{self.fn.__name__} is a Triton kernel and Triton is not installed here (the "
                "CPU path does not need it; the GPU kernels do: pip install triton)"
            )

        __call__ = _missing
        __getitem__ = _missing

    class _Triton:
        language = _Anything()

        @staticmethod
        def jit(fn=None, **options):
            return _Kernel(fn) if fn is not None else _Kernel

        @staticmethod
        def cdiv(a: int, b: int) -> int:
            return -(-a // b)

        @staticmethod
        def next_power_of_2(n: int) -> int:
            return 1 << max(0, n - 1).bit_length()

    triton = _Triton()
    tl = triton.language

__all__ = ["AVAILABLE", "tl", "triton"]
