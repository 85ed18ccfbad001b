"""The composition root: the one place that builds config → ops → model → proposer → (tensor
parallel shards) → engine. Nothing below imports it; the CLI, the server and users call it.

    engine = build_engine()                       # the default model, EngineConfig()
    engine = build_engine("path/to/model", EngineConfig(drafter="ngram"))
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from lanes.backends import make_ops
from lanes.cache.kv_pool import KVPool
from lanes.config import ConfigError, EngineConfig
from lanes.drafter import Proposer, make_proposer
from lanes.engine import Engine
from lanes.kernels import packed_linear_cpu
from lanes.models import Checkpoint, build_decoder, open_checkpoint
from lanes.models.decoder import Decoder
from lanes.packed import PackedWeight
from lanes.parallel import Comm, shard_config, shard_weights, worker_loop
from lanes.runner import build_runner
from lanes.warmup import prepare_device


def keeps_gguf_packed(cfg: EngineConfig, parallel: Comm | None = None) -> bool:
    """Whether a .gguf's quantized weights stay codes: as configured, else where that is the
    faster form: exact mode on the CPU with the C packed linear built (the default model: 20.5
    -> 52.6 tok/s on the 2-core dev box, bench/NOTES.md). Elsewhere the packed path costs speed
    (the torch ops dequantize tiles every step; tensor parallelism refuses codes)."""
    if cfg.gguf_packed is not None:
        return cfg.gguf_packed
    on_cpu = cfg.device == "cpu" and cfg.kernels != "triton"
    return parallel is None and cfg.exact and on_cpu and packed_linear_cpu.available()


def build_engine(
    model: str | None = None,
    config: EngineConfig | None = None,
    *,
    checkpoint: Checkpoint | None = None,
    clock: Callable[[], float] = time.perf_counter,
    proposer: Proposer | None = None,
    parallel: Comm | None = None,
    engine_type: type[Engine] = Engine,
) -> Engine:
    """An engine for `model` (a path, repo id or None for the default) or an opened checkpoint.
    proposer: a drafter built by the caller (else config.drafter's); parallel: run as one rank of
    a tensor-parallel group (the drafter lives on rank 0); engine_type: an Engine subclass (tests
    that change one mechanism to show a check fails without it)."""
    cfg = config or EngineConfig()
    ckpt = _within_max_model_len(
        checkpoint or open_checkpoint(model, keeps_gguf_packed(cfg, parallel)), cfg
    )
    dtype = getattr(torch, cfg.torch_dtype_name)
    ops = make_ops(cfg.exact, cfg.device, cfg.kernels, cfg.delta_rule)
    decoder = build_decoder(ckpt, ops, dtype, cfg.device)
    if parallel is not None:
        local = shard_config(ckpt.config, parallel.world)
        weights = shard_weights(decoder.weights, ckpt.config, parallel.rank, parallel.world)
        decoder = Decoder(local, weights, ops, parallel, parallel.rank * local.vocab_size)
    mc = ckpt.config
    per_block = KVPool.bytes_per_block(
        len(mc.attention_layers), cfg.block_size, mc.num_kv_heads, mc.head_dim, dtype
    )
    state_bytes = _state_bytes(mc, cfg.max_lanes, ops.chunked_delta)
    budget = cfg.kv_cache_bytes - state_bytes
    if mc.is_hybrid and budget < per_block:
        raise ConfigError(
            f"--kv-cache-bytes {cfg.kv_cache_bytes} does not hold the recurrent state of "
            f"{cfg.max_lanes} lanes ({state_bytes} bytes) and one KV block"
        )
    runner = build_runner(
        decoder, max(1, budget // per_block), cfg, dtype, mixed_graphs=cfg.mixed_graphs
    )
    if proposer is None and (parallel is None or parallel.rank == 0):
        proposer = make_proposer(cfg.drafter, cfg, ckpt)
    if cfg.cost_aware_drafts is None and _verify_rows_are_dear(decoder):
        cfg = dataclasses.replace(cfg, cost_aware_drafts=True)
    engine = engine_type(cfg, ckpt, runner, proposer, clock=clock, comm=parallel)
    # graphs captured and samplers compiled before any request
    prepare_device(
        cfg, runner, engine.device_rounds,
        verifies_drafts=proposer is not None,
        single_process=parallel is None,
    )  # fmt: skip
    return engine


def _within_max_model_len(ckpt: Checkpoint, cfg: EngineConfig) -> Checkpoint:
    """The checkpoint with its context cut to --max-model-len, so the tables sized by the
    context (RoPE, block tables) are only as long as a request can reach."""
    own = ckpt.config.max_position_embeddings
    if cfg.max_model_len is None or cfg.max_model_len == own:
        return ckpt
    if cfg.max_model_len > own:
        raise ConfigError(
            f"max_model_len {cfg.max_model_len} is above the model's context ({own} tokens)"
        )
    shorter = dataclasses.replace(ckpt.config, max_position_embeddings=cfg.max_model_len)
    return dataclasses.replace(ckpt, config=shorter)


def _verify_rows_are_dear(decoder: Decoder) -> bool:
    """Whether the target's linears run on the CPU's C packed kernel. There each verified draft
    costs about a quarter of a decode step (float32 FMAs, not weight bytes, bound a row), so
    drafts are priced by their measured cost (EngineConfig.cost_aware_drafts; the engine's own
    default covers CUDA): the shipped drafter went 61.0 -> 70.7 tok/s (bench/NOTES.md,
    seventeenth session). The CPU's float path keeps k from acceptance alone, as measured there."""
    qkv = decoder.weights.layers[0].qkv
    return isinstance(qkv, PackedWeight) and packed_linear_cpu.takes(qkv)


def _state_bytes(mc, lanes: int, chunked: bool) -> int:
    """What a hybrid model's recurrent-state slots take of the KV budget (0 for others): one
    per lane and the scratch slot of CUDA-graph padding lanes."""
    if not mc.is_hybrid:
        return 0
    from lanes.cache.state_pool import StatePool
    from lanes.models.recurrent_layout import recurrent_layout

    layout = recurrent_layout(mc, chunked)
    return (lanes + 1) * StatePool.bytes_per_slot(len(mc.linear_layers), layout.conv, layout.state)


def _rank_main(rank: int, world: int, init_file: str, model: str, config, job, results) -> None:
    on_gpu = config.device.startswith("cuda")
    if on_gpu:  # one GPU per rank
        torch.cuda.set_device(rank)
        config = dataclasses.replace(config, device=f"cuda:{rank}")
    backend = "nccl" if on_gpu else "gloo"
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        engine = build_engine(model, config, parallel=Comm(rank, world))
        if rank == 0:
            try:
                results.put(("ok", job(engine)))
            except Exception as e:  # report it to the parent, then release the workers
                results.put(("error", f"{type(e).__name__}: {e}"))
            engine.comm.broadcast(None)
        else:
            worker_loop(engine.runner, engine.comm, config.device)
    except KeyboardInterrupt:  # the server was stopped: every rank leaves
        pass
    finally:
        dist.destroy_process_group()


def run_tensor_parallel(world: int, model: str, config, job: Callable) -> Any:
    """Start `world` processes, serve `model` sharded over them, and return job(engine) from rank
    0. `job` must be a module-level function (it is pickled into the new processes)."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    fd, init_file = tempfile.mkstemp(prefix="lanes-tp-")
    os.close(fd)
    os.unlink(init_file)  # the file store creates it
    procs = [
        ctx.Process(target=_rank_main, args=(r, world, init_file, model, config, job, results))
        for r in range(world)
    ]
    for p in procs:
        p.start()
    try:
        status, value = results.get(timeout=600)
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    if status != "ok":
        raise RuntimeError(f"tensor-parallel job failed: {value}")
    return value
