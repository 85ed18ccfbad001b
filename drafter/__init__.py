"""Proposers for speculative decoding: a model drafter, n-gram prompt lookup, and replay (bench)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lanes.drafter.base import Draft, Proposer

if TYPE_CHECKING:
    from lanes.config import EngineConfig
    from lanes.models import Checkpoint

__all__ = ["Draft", "Proposer", "make_proposer"]


def make_proposer(spec: str, config: EngineConfig, target: Checkpoint) -> Proposer | None:
    """`--drafter`: "none", "ngram" (or "ngram:MIN-MAX", the suffix lengths looked up), a `lanes distill` (EAGLE-style) directory, such a
    directory + "+ngram" (prompt lookup first, the head elsewhere: drafter/hybrid.py), or a
    drafter model (HF directory, .gguf file, repo id)."""
    if spec in ("", "none"):
        return None
    if spec == "ngram" or spec.startswith("ngram:"):  # "ngram:2-4": suffixes of 2 to 4 tokens
        from lanes.drafter.ngram import NgramProposer

        low, _, high = spec.removeprefix("ngram").removeprefix(":").partition("-")
        if not low:
            return NgramProposer()
        try:
            return NgramProposer(min_n=int(low), max_n=int(high))
        except ValueError as e:
            raise ValueError(f"--drafter {spec}: expected ngram:MIN-MAX, e.g. ngram:1-3") from e
    from lanes.drafter.eagle import EagleDrafter, is_eagle_dir

    spec = _hub_head(spec)
    if is_eagle_dir(spec):
        return EagleDrafter(spec, target, config)
    head, plus, lookup = spec.rpartition("+")
    if plus and lookup == "ngram":
        head = _hub_head(head)
    if plus and lookup == "ngram" and is_eagle_dir(head):
        from lanes.drafter.hybrid import HybridProposer
        from lanes.drafter.ngram import NgramProposer

        # suffixes of 3+ tokens: shorter matches guess worse than the head does
        return HybridProposer(EagleDrafter(head, target, config), NgramProposer(min_n=3))
    from lanes.drafter.model import ModelDrafter, with_shared_tensors
    from lanes.models import open_checkpoint

    return ModelDrafter(
        with_shared_tensors(open_checkpoint(spec), target), target.tokenizer, config
    )


def _hub_head(spec: str) -> str:
    """A repo id naming a published EAGLE-3 head -> its local snapshot (fetched once; the
    original releases ship pytorch_model.bin, fetched where no safetensors came); anything else
    as given."""
    from pathlib import Path

    from lanes.drafter.eagle3_format import is_eagle3_dir
    from lanes.models.resolve import fetch_file, hub_snapshot, is_repo_id

    if Path(spec).exists() or not is_repo_id(spec):
        return spec
    local = hub_snapshot(spec)
    if not is_eagle3_dir(local):
        return spec  # a draft model: opened as a checkpoint
    if not (local / "model.safetensors").is_file():
        fetch_file(spec, "pytorch_model.bin")
    return str(local)
