"""Work done once when an engine is built, so that no request pays for it. On a GPU: every lane
bucket's CUDA graph captured (decode, the full verify when a drafter verifies through the
target's graphs, and decode beside a prompt chunk), the device rounds' buckets captured, and the sampling kernels compiled. On the
CPU: the C kernels of exact mode built.

Done lazily, each of these lands inside some round and stalls every lane running then: on the
H200 a c64 run (bench/speed/c64.py) had single rounds of 0.8-2.7 s where a graph was captured or
a kernel compiled, and a first seeded request waited ~2 s for the sampler's compile. vLLM
captures its decode graphs at start for the same reason.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from lanes.config import EngineConfig
    from lanes.device_rounds import DeviceRounds
    from lanes.runner import ModelRunner

log = logging.getLogger("lanes")


def prepare_device(
    config: EngineConfig,
    runner: ModelRunner,
    device_rounds: DeviceRounds | None,
    *,
    verifies_drafts: bool,
    single_process: bool,
) -> None:
    """Capture and compile what an engine's rounds will need (CUDA, one process, unless
    EngineConfig.capture_at_start is off; on the CPU in exact mode, build the C kernels).
    verifies_drafts: there is a drafter, whose drafts host-managed rounds verify through the
    target's graphs (also beside device rounds: while those pause, and for probes)."""
    cfg = config
    ops = runner.decoder.ops.name
    if cfg.device == "cpu" and ops == "exact":
        build_cpu_kernels()
    if not cfg.device.startswith("cuda") or not cfg.capture_at_start or not single_process:
        return
    start = time.perf_counter()
    captured = 0
    try:  # serving does not depend on it: what is not made now is made at first use, as before
        graphs = runner.graphs
        if graphs is not None:
            tokens = [1]  # decode
            if verifies_drafts:  # a probe's verify and a full one (other k: at first use)
                tokens += sorted({2, 1 + cfg.num_draft_tokens})
            captured += graphs.prepare(tokens)
        if runner.mixed is not None:  # decode rows beside a prompt chunk
            captured += runner.mixed.prepare()
        if device_rounds is not None:
            captured += device_rounds.prepare()
        if ops == "triton":
            compile_samplers(runner)
        torch.cuda.synchronize(cfg.device)
    except Exception:
        log.exception("capturing graphs at start failed; the rounds capture them at first use")
        return
    log.info(
        "captured %d CUDA graphs and compiled the samplers in %.1f s",
        captured,
        time.perf_counter() - start,
    )


def build_cpu_kernels() -> None:
    """Exact mode on the CPU: the C kernels built now (about a second each, once per machine:
    kernels/native.py caches them), not inside the first request's forward."""
    from lanes.kernels.native import CPU_SOURCES, load

    for source in CPU_SOURCES:
        load(source)


def compile_samplers(runner: ModelRunner) -> None:
    """One launch of each sampling kernel (greedy; seeded with top-k and top-p) on throwaway
    logits of the runner's vocabulary: Triton compiles them now."""
    from lanes.kernels.sampling import RowParams, greedy_tokens, sample_with

    device = runner.device
    logits = torch.randn((2, runner.decoder.cfg.vocab_size), device=device)
    params = RowParams.upload([0.0, 1.0], [0, 20], [1.0, 0.9], [0, 1], device)
    sample_with(logits, params, torch.zeros(2, dtype=torch.int64, device=device))
    greedy_tokens(logits)
