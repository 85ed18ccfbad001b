"""lanes: an LLM serving runtime built around exact speculative decoding."""

from pathlib import Path as _Path

from lanes import _source_tree

# Before anything imports lanes.kernels / lanes.cache / lanes.drafter from a plain checkout.
_source_tree.install(_Path(__file__).resolve().parent)

__all__ = ["Completion", "Engine", "EngineConfig", "RequestError", "SamplingParams", "build_engine"]
__version__ = "0.1.0"

# The public names load at first use, so `import lanes` (and `lanes --help`, a typo'd flag) does
# not wait for torch.
_HOMES = {"build_engine": "lanes.build", "EngineConfig": "lanes.config", "Completion": "lanes.engine",
          "Engine": "lanes.engine", "RequestError": "lanes.engine",
          "SamplingParams": "lanes.sampling"}  # fmt: skip


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'lanes' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value
