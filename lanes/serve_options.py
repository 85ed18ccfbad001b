"""`lanes serve` options as vLLM users type them: byte sizes with units, `--speculative-config`
JSON, `--gpu-memory-utilization`; each bad value is a one-line error naming the flag."""

from __future__ import annotations

import json
import math
import re

_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
          "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}  # fmt: skip
_BYTES = re.compile(r"\s*(\d+(?:\.\d+)?(?:e\d+)?)\s*([kmgt]i?)?b?\s*", re.IGNORECASE)
SPECULATIVE_KEYS = ("method", "model", "num_speculative_tokens")
_ACTIVATION_MARGIN = 2**30  # bytes left for activations and CUDA graphs


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
    k = spec.get("num_speculative_tokens")
    if k is not None and (not isinstance(k, int) or isinstance(k, bool) or k < 0):
        raise ValueError(f"--speculative-config: num_speculative_tokens must be >= 0, got {k!r}")
    method, model = spec.get("method"), spec.get("model")
    if method == "ngram":
        if model is not None:
            raise ValueError("--speculative-config: method 'ngram' takes no model")
        return "ngram", k
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
