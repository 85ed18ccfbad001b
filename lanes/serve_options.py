"""`lanes serve` options as vLLM users type them: byte sizes with units, `--speculative-config`
JSON, `--gpu-memory-utilization`, ports, devices, origins, a chat template file; each bad value
is a one-line error naming the flag (argparse types raise ArgumentTypeError, the rest
ValueError, which `lanes` prints as one line)."""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re

_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
          "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}  # fmt: skip
_BYTES = re.compile(r"\s*(\d+(?:\.\d+)?(?:e\d+)?)\s*([kmgt]i?)?b?\s*", re.IGNORECASE)
SPECULATIVE_KEYS = ("method", "model", "num_speculative_tokens", "prompt_lookup_max",
                    "prompt_lookup_min", "draft_tensor_parallel_size",
                    "disable_by_batch_size")  # fmt: skip
# "eagle"/"eagle3": a `lanes distill` head or a published EAGLE-3 head; "draft_model": a model
_SPECULATIVE_METHODS = (None, "ngram", "[ngram]", "eagle", "eagle3", "draft_model")
_ACTIVATION_MARGIN = 2**30  # bytes left for activations and CUDA graphs


class _CliError(Exception):
    """A command's bad input: main() prints it as one line and exits with status 2."""


def parse_bytes(text: str) -> int:
    """'1GiB', '512MiB', '2G', '1e9', '1048576' -> bytes (K/M/G/T: powers of 10; Ki/Mi/Gi/Ti:
    powers of 2)."""
    m = _BYTES.fullmatch(text)
    if m is None:
        raise ValueError(f"{text!r} is not a byte size (e.g. 1073741824, 1GiB, 512MiB, 2G)")
    value = float(m.group(1)) * _UNITS[(m.group(2) or "").lower()]
    if not math.isfinite(value) or value >= 2**63:
        raise ValueError(f"{text!r} is more bytes than any machine has")
    return int(value)


def speculative_options(text: str) -> tuple[str, int | None]:
    """vLLM's --speculative-config JSON -> (lanes' --drafter, draft tokens or None):
    {"method": "ngram"} or {"model": DIR-or-repo} (a `lanes distill` head or a draft model),
    with "num_speculative_tokens"."""
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"--speculative-config is not JSON: {e}") from e
    if not isinstance(spec, dict):
        raise ValueError("--speculative-config must be a JSON object")
    unknown = sorted(set(spec) - set(SPECULATIVE_KEYS))
    if unknown:
        raise ValueError(
            f"--speculative-config: unsupported keys {unknown}; lanes reads {list(SPECULATIVE_KEYS)}"
        )
    tp = spec.get("draft_tensor_parallel_size", 1)
    if tp != 1:  # vLLM's launch lines for EAGLE heads pass 1: the drafter runs unsharded here
        raise ValueError(
            f"--speculative-config: draft_tensor_parallel_size {tp!r}: lanes runs the drafter "
            "unsharded, on rank 0 (give 1 or leave it out)"
        )
    if "disable_by_batch_size" in spec:  # lanes drafts per round by the measured costs instead
        logging.getLogger("lanes").warning(
            "--speculative-config: disable_by_batch_size is ignored; lanes drafts each round "
            "as many tokens as pay for themselves by its measured costs (docs/speculative.md)"
        )
    k = spec.get("num_speculative_tokens")
    if k is not None and (not isinstance(k, int) or isinstance(k, bool) or k < 0):
        raise ValueError(f"--speculative-config: num_speculative_tokens must be >= 0, got {k!r}")
    method, model = spec.get("method"), spec.get("model")
    if method not in _SPECULATIVE_METHODS:
        raise ValueError(
            f"--speculative-config: method {method!r} is not served by lanes; it serves "
            + ", ".join(m for m in _SPECULATIVE_METHODS if m)
        )
    lookup = [spec.get("prompt_lookup_min"), spec.get("prompt_lookup_max")]
    if method in ("ngram", "[ngram]"):
        if model is not None:
            raise ValueError("--speculative-config: method 'ngram' takes no model")
        if lookup == [None, None]:
            return "ngram", k
        low, high = lookup[0] or 1, lookup[1]  # vLLM: the minimum defaults to 1
        if high is None or not all(isinstance(n, int) and n >= 1 for n in (low, high)):
            raise ValueError(
                "--speculative-config: prompt_lookup_max (and prompt_lookup_min) must be whole "
                f"numbers >= 1, got {lookup[1]!r} ({lookup[0]!r})"
            )
        if low > high:
            raise ValueError(f"--speculative-config: prompt_lookup_min {low} > max {high}")
        return f"ngram:{low}-{high}", k
    if lookup != [None, None]:
        raise ValueError("--speculative-config: prompt_lookup_* go with method 'ngram'")
    if isinstance(model, str) and model:
        return model, k
    raise ValueError(
        '--speculative-config needs "method": "ngram" or a "model" (a lanes distill '
        f"directory or a draft model), got {spec}"
    )


def kv_bytes_for_utilization(fraction: float, total_bytes: int, weight_bytes: int) -> int:
    """The KV pool that keeps the engine within `fraction` of a GPU's memory: that share, less
    the weights and a margin for activations."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"--gpu-memory-utilization must be in (0, 1], got {fraction}")
    room = int(fraction * total_bytes) - weight_bytes - _ACTIVATION_MARGIN
    if room <= 0:
        raise ValueError(
            f"--gpu-memory-utilization {fraction}: {fraction * total_bytes / 2**30:.1f} GiB does "
            f"not hold the weights ({weight_bytes / 2**30:.1f} GiB) and a 1 GiB margin"
        )
    return room


def chat_template_text(given: str) -> str:
    """--chat-template: a file's text, or the template itself; checked that it compiles. A path
    that names nothing (a typo) is an error, never a template that renders as that path."""
    from pathlib import Path

    from lanes.chat import check_template

    if "{{" not in given and "{%" not in given:  # not a template: it must be a file
        try:
            given = Path(given).read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"--chat-template {given[:200]}: not a readable file ({e})") from e
    try:
        check_template(given)
    except ValueError as e:
        raise ValueError(f"--chat-template: {e}") from e
    return given


def device_memory(device: str) -> int:
    """Bytes of memory the device has: a GPU's, or the machine's for the CPU."""
    import torch

    if device.startswith("cuda"):
        return torch.cuda.get_device_properties(torch.device(device)).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def fits_memory(kv_bytes: int, device: str) -> int:
    """The KV pool's bytes, refused where the device does not have them at all."""
    total = device_memory(device)
    if kv_bytes > total:
        raise ValueError(
            f"--kv-cache-bytes {kv_bytes} is more than the {device} memory ({total} bytes)"
        )
    return kv_bytes


_HUMAN_INT = re.compile(r"(\d+(?:\.\d+)?)([kmgtKMGT]?)")


def human_int(text: str) -> int:
    """A count as vLLM's flags take one: 32768, 32k or 25.6k (powers of 1,000), 32K (powers of
    1,024; whole numbers only)."""
    match = _HUMAN_INT.fullmatch(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(
            f"expected a number such as 4096, 32k or 32K, got {text!r:.40}"
        )
    number, suffix = match.groups()
    if suffix.islower():
        return int(float(number) * 1000 ** (" kmgt".index(suffix)))
    if "." in number:
        raise argparse.ArgumentTypeError(f"{text!r}: a decimal takes k/m/g/t, not {suffix}")
    return int(number) * 1024 ** (" KMGT".index(suffix or " "))


DTYPES = {"auto": "auto", "float32": "float32", "float": "float32", "bfloat16": "bfloat16",
          "float16": "float16", "half": "float16"}  # fmt: skip


def dtype_name(text: str) -> str:
    """--dtype as vLLM takes it: auto, bfloat16, float16 (half) or float32 (float)."""
    if text not in DTYPES:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(DTYPES)}, got {text!r:.40}")
    return DTYPES[text]


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r:.40}") from e
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def byte_size(text: str) -> int:
    try:
        return parse_bytes(text)
    except ValueError as e:  # argparse shows an ArgumentTypeError's own message
        raise argparse.ArgumentTypeError(str(e)) from e


def positive_bytes(text: str) -> int:
    value = byte_size(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 byte, got {text!r:.40}")
    return value


def port_number(text: str) -> int:
    """A TCP port; 0: any free one (the log line says which)."""
    value = 0 if text.strip() == "0" else positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"a TCP port is at most 65535, got {value}")
    return value


def device_name(text: str) -> str:
    if not re.fullmatch(r"cpu|cuda(:\d+)?", text):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {text!r:.40}")
    return text


def origins(text: str) -> tuple[str, ...]:
    """--allowed-origins as vLLM takes it (a JSON list) or comma-separated."""
    try:
        value = json.loads(text)
    except ValueError:
        value = [part.strip() for part in text.split(",") if part.strip()]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise argparse.ArgumentTypeError(f"expected a list of origins, got {text!r:.80}")
    return tuple(value)
