"""Proposers for speculative decoding: a model drafter, n-gram prompt lookup, and replay (bench)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from drafter.base import Draft, Proposer

if TYPE_CHECKING:
    from lanes.config import EngineConfig
    from lanes.tokenizer import Tokenizer

__all__ = ["Draft", "Proposer", "make_proposer"]


def make_proposer(spec: str, config: EngineConfig, target_tokenizer: Tokenizer) -> Proposer | None:
    """`--drafter`: "none", "ngram", or a drafter model (HF directory, .gguf file, repo id)."""
    if spec in ("", "none"):
        return None
    if spec == "ngram":
        from drafter.ngram import NgramProposer

        return NgramProposer()
    from drafter.model import ModelDrafter
    from lanes.models import open_checkpoint

    return ModelDrafter(open_checkpoint(spec), target_tokenizer, config)
