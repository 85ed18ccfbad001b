"""Shared helpers for kernel launchers."""

from __future__ import annotations

import os

import torch


def interpreting() -> bool:
    """True when Triton runs kernels on the CPU interpreter (TRITON_INTERPRET=1): there, kernels
    convert bf16/fp16 loads to fp32 at once (bf16 arithmetic came out wrong in the interpreter)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def check(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(message)


FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
