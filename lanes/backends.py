"""Which implementation of the ops interface serves a configuration: Triton kernels, or the
plain-torch exact / fast ops. Above both (lanes.ops defines the interface, lanes.triton_ops one
implementation), so neither imports the other's chooser."""

from __future__ import annotations

from lanes.config import ConfigError
from lanes.ops import ExactOps, FastOps, Ops


def make_ops(
    exact: bool, device: str = "cpu", kernels: str = "auto", delta_rule: str = "recurrent"
) -> Ops:
    """kernels: "auto" (Triton on CUDA in exact mode, torch otherwise), "triton" or "torch";
    delta_rule: "recurrent" or "chunked" (hybrids' DeltaNet layers; Triton only)."""
    use_triton = kernels == "triton" or (kernels == "auto" and exact and device.startswith("cuda"))
    if use_triton:
        from lanes.triton_ops import TritonOps

        return TritonOps(chunked_delta=delta_rule == "chunked")
    if delta_rule == "chunked":
        raise ConfigError(
            "delta_rule 'chunked' runs on the Triton kernels: kernels 'triton', or 'auto' on a "
            "GPU in exact mode"
        )
    return ExactOps() if exact else FastOps()
