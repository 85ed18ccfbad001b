"""lanes: an LLM serving runtime built around exact speculative decoding."""

from pathlib import Path as _Path

from lanes import _source_tree

# Before anything imports lanes.kernels / lanes.cache / lanes.drafter from a plain checkout.
_source_tree.install(_Path(__file__).resolve().parent)

from lanes.build import build_engine  # noqa: E402
from lanes.config import EngineConfig  # noqa: E402
from lanes.engine import Completion, Engine, RequestError  # noqa: E402
from lanes.sampling import SamplingParams  # noqa: E402

__all__ = ["Completion", "Engine", "EngineConfig", "RequestError", "SamplingParams", "build_engine"]
__version__ = "0.1.0"
