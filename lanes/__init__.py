"""lanes: an LLM serving runtime built around exact speculative decoding."""

from lanes.config import EngineConfig
from lanes.engine import Completion, Engine, RequestError
from lanes.sampling import SamplingParams

__all__ = ["Completion", "Engine", "EngineConfig", "RequestError", "SamplingParams"]
__version__ = "0.1.0"
