"""vLLM's `serve` flags that a launch script carries, taken by `lanes serve` too: each one either
does what it does in vLLM (under lanes' own name where lanes has one), or — where lanes has no
such thing — is accepted with a one-line notice at startup saying what lanes does instead. None
is a silent no-op and none stops the server from starting.

`VLLM_FLAGS` is plain data: the flag, its argparse settings, and `notice(value)` — the line to
log for that value (None where lanes does what vLLM means). `apply` turns the honoured ones into
lanes' settings.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lanes.reasoning import PARSERS
from lanes.serve_options import human_int, positive_int
from lanes.tool_formats import ALIASES, FORMATS

BOOL = argparse.BooleanOptionalAction


@dataclass(frozen=True)
class VllmFlag:
    name: str  # as vLLM spells it
    settings: dict[str, Any] = field(default_factory=dict)  # add_argument's keywords
    notice: Callable[[Any], str | None] = lambda value: None  # the startup line for a value

    @property
    def dest(self) -> str:
        return self.name.removeprefix("--").replace("-", "_")


def _unless(*honoured: Any, say: str) -> Callable[[Any], str | None]:
    """A notice for every given value but the honoured ones (None: the flag was not given)."""
    return lambda value: None if value is None or value in honoured else say.format(value=value)


VLLM_FLAGS = [
    # honoured: lanes does what vLLM means
    VllmFlag("--enable-prefix-caching", {"action": BOOL, "default": None}),  # False: no cache
    VllmFlag("--enforce-eager", {"action": "store_true"}),  # no CUDA graphs
    VllmFlag("--block-size", {"type": positive_int, "default": None}),  # KV block size
    VllmFlag("--max-logprobs", {"type": int, "default": 20}),  # a request's logprobs cap
    VllmFlag(
        "--uvicorn-log-level",
        {"default": "info", "choices": ["debug", "info", "warning", "error", "critical", "trace"]},
    ),  # fmt: skip
    VllmFlag("--root-path", {"default": None}),  # behind a path-routing proxy
    VllmFlag("--hf-token", {"default": None}),  # for gated repos
    VllmFlag("--revision", {"default": None}),  # the model repo's branch, tag or commit
    VllmFlag("--download-dir", {"default": None}),  # huggingface_hub's cache directory
    VllmFlag("--disable-log-stats", {"action": "store_true"}),  # lanes logs no periodic stats
    VllmFlag("--enable-auto-tool-choice", {"action": "store_true"}),  # always on in lanes
    # accepted, with what lanes does instead
    VllmFlag(
        "--enable-chunked-prefill",
        {"action": BOOL, "default": None},
        _unless(
            True,
            say="--no-enable-chunked-prefill: lanes always computes prompts in chunks "
            "between decode steps (lane rounds); the flag changes nothing",
        ),
    ),  # fmt: skip
    VllmFlag(
        "--tool-call-parser",
        {"default": None},
        _unless(
            *FORMATS,
            *ALIASES,
            say="--tool-call-parser {value}: lanes parses the hermes, llama3_json, mistral, "
            "qwen3_coder and glm45 formats; {value}'s is read as hermes",
        ),
    ),  # fmt: skip
    VllmFlag(
        "--reasoning-parser",
        {"default": None},
        _unless(
            *PARSERS,
            say="--reasoning-parser {value}: lanes reads <think> ... </think> blocks (as qwen3 "
            "and deepseek_r1 write them); {value}'s format is read as that",
        ),
    ),  # fmt: skip
    VllmFlag(
        "--trust-remote-code",
        {"action": "store_true"},
        lambda value: (
            "--trust-remote-code: lanes never runs code from a model repository; the "
            "architectures it knows load without it"
            if value
            else None
        ),
    ),
    VllmFlag(
        "--generation-config",
        {"default": None},
        _unless(
            "vllm",
            say="--generation-config {value}: lanes does not apply a model's "
            "generation_config.json; unset sampling fields take OpenAI's defaults",
        ),
    ),  # fmt: skip
    VllmFlag(
        "--quantization",
        {"default": None},
        _unless(
            say="--quantization {value}: lanes reads a checkpoint's quantization from its "
            "files (MLX affine, GGUF Q4_0/Q4_1/Q8_0); the flag is not applied"
        ),
    ),  # fmt: skip
    VllmFlag(
        "--kv-cache-dtype",
        {"default": None},
        _unless("auto", say="--kv-cache-dtype {value}: lanes keeps K/V in the model's dtype"),
    ),
    VllmFlag(
        "--structured-outputs-config",
        {"default": None},
        _unless(
            say="--structured-outputs-config: lanes compiles structured outputs with "
            "llguidance; the options are not applied"
        ),
    ),  # fmt: skip
    VllmFlag(
        "--lora-modules",
        {"nargs": "+", "default": None},
        _unless(
            say="--lora-modules: lanes serves no LoRA adapters; a request naming one gets "
            "404 model_not_found"
        ),
    ),  # fmt: skip
    VllmFlag(
        "--load-format",
        {"default": None},
        _unless(
            "auto",
            "safetensors",
            "gguf",
            say="--load-format {value}: lanes loads safetensors and GGUF files only (never "
            "pickles); the checkpoint's own files decide",
        ),
    ),  # fmt: skip
    VllmFlag(
        "--swap-space",
        {"type": float, "default": None},
        _unless(
            say="--swap-space: lanes keeps no CPU swap; a preempted request's whole blocks go "
            "to the prompt cache and the rest is recomputed"
        ),
    ),  # fmt: skip
]


def add_vllm_flags(group: argparse._ArgumentGroup) -> None:
    for flag in VLLM_FLAGS:
        group.add_argument(flag.name, **flag.settings)


def notices(args: argparse.Namespace) -> list[str]:
    """The startup lines for the flags given (none for those lanes honours)."""
    lines = [flag.notice(getattr(args, flag.dest)) for flag in VLLM_FLAGS]
    if args.max_logprobs > 20:
        lines.append(f"--max-logprobs {args.max_logprobs}: lanes returns at most 20 logprobs")
    return [line for line in lines if line]


def apply(args: argparse.Namespace, config: dict[str, Any]) -> None:
    """The honoured flags into EngineConfig keywords (and the process's hub token)."""
    if args.enable_prefix_caching is False:
        config["prompt_cache_bytes"] = 0
    if args.enforce_eager:
        config["cuda_graphs"] = False
    if args.block_size is not None:
        config["block_size"] = args.block_size
    if args.hf_token:  # huggingface_hub reads it at each request
        os.environ["HF_TOKEN"] = args.hf_token


def model_len(text: str) -> int:
    """--max-model-len as vLLM takes it: 32768, 32k (32,000) or 32K (32,768)."""
    value = human_int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return value
