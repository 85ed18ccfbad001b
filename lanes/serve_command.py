"""`lanes serve`: the flags become an engine config, the engine is built off the main thread
while the server starts, and uvicorn serves it (lanes/server.py)."""

from __future__ import annotations

import argparse
import dataclasses
import math

from lanes.serve_options import _CliError, chat_template_text, device_memory, fits_memory


def _serve(args: argparse.Namespace) -> int:
    import logging
    import random

    from lanes.build import build_engine
    from lanes.config import EngineConfig, api_key_from_env
    from lanes.serve_options import kv_bytes_for_utilization, speculative_options
    from lanes.vllm_flags import apply, notices

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    log = logging.getLogger("lanes")
    for line in notices(args):
        log.warning("%s", line)
    if args.model_arg and args.model and args.model_arg != args.model:
        raise _CliError(f"two models given: {args.model_arg!r} and --model {args.model!r}")
    model = _from_hub(args.model_arg or args.model, args, "--model")
    drafter, num_drafts = args.drafter, args.num_draft_tokens
    if args.speculative_config is not None:
        if drafter != "none":
            raise _CliError("--speculative-config and --drafter both name a drafter; give one")
        drafter, k = speculative_options(args.speculative_config)
        num_drafts = num_drafts if k is None else k
    if args.seed is not None:  # the seeds drawn for unseeded sampled requests repeat run to run
        random.seed(args.seed)
    device = args.device or ("cuda" if _cuda() else "cpu")
    if device.startswith("cuda") and not _cuda():
        raise _CliError(f"--device {device}: this machine has no CUDA device (try --device cpu)")
    kv_bytes = args.kv_cache_bytes
    if args.gpu_memory_utilization is not None:
        if kv_bytes is not None:
            raise _CliError("--gpu-memory-utilization and --kv-cache-bytes both size the KV pool")
        if device.startswith("cuda"):
            kv_bytes = _kv_bytes_for(args, model, device, kv_bytes_for_utilization)
        else:
            log.info("--gpu-memory-utilization is for CUDA; ignored")
    settings = dict(
        device=device,
        dtype=args.dtype,
        exact=not args.fast,
        delta_rule=args.delta_rule,
        drafter=drafter,
        num_draft_tokens=num_drafts,
        draft_branches=args.draft_branches,
        prefill_share=args.prefill_share,
        prefill_bursts=args.prefill_bursts,
        max_lanes=args.max_lanes,
        max_tokens_per_round=(
            EngineConfig.max_tokens_per_round
            if args.max_tokens_per_round is None
            else args.max_tokens_per_round
        ),
        prompt_cache_bytes=args.prompt_cache_bytes,
        state_snapshot_bytes=args.state_snapshot_bytes,
        kv_cache_bytes=fits_memory(512 * 2**20 if kv_bytes is None else kv_bytes, device),
        overlap=args.overlap,
        prefetch_masks=args.prefetch_masks,
        device_rounds=args.device_rounds,
        max_model_len=args.max_model_len,
        gguf_packed=args.gguf_packed,
    )
    apply(args, settings)
    config = EngineConfig(**settings)
    names = args.served_model_name or [model or "SmolLM2-135M-Instruct"]
    template = None if args.chat_template is None else chat_template_text(args.chat_template)

    def serve(engine, **options) -> None:
        if template is not None:
            engine.tokenizer.chat_template = template
        serve_engine(engine, **options)

    options = dict(
        host=args.host,
        port=args.port,
        names=names,
        api_key=args.api_key or api_key_from_env(),
        allow_special_tokens=args.allow_special_tokens,
        access_log=not args.disable_uvicorn_access_log,
        log_requests=not args.disable_log_requests,
        allowed_origins=args.allowed_origins,
        report_cached_tokens=args.enable_prompt_tokens_details,
        max_logprobs=min(args.max_logprobs, 20),
        log_stats=not args.disable_log_stats,
        log_level=args.uvicorn_log_level,
        reasoning_parser=args.reasoning_parser,
        tool_call_parser=args.tool_call_parser,
        root_path=args.root_path or "",
    )
    sock = _bind(args.host, args.port)  # before the model loads: a taken port fails at once
    options["port"] = sock.getsockname()[1]  # --port 0: the one the system gave
    if args.tensor_parallel > 1:
        import functools

        sock.close()  # rank 0 binds it again in its own process

        from lanes.build import run_tensor_parallel

        if args.tokenizer:
            raise _CliError("--tokenizer is not supported with --tensor-parallel yet")
        run_tensor_parallel(
            args.tensor_parallel, model, config, functools.partial(serve, **options)
        )
        return 0
    if args.tokenizer:
        from lanes.build import keeps_gguf_packed

        tokenizer = _from_hub(args.tokenizer, args, "--tokenizer")
        checkpoint = with_tokenizer(model, tokenizer, keeps_gguf_packed(config))
        engine = _off_the_main_thread(build_engine, checkpoint=checkpoint, config=config)
        serve(engine, sock=sock, **options)
        return 0
    serve(_off_the_main_thread(build_engine, model, config), sock=sock, **options)
    return 0


def _bind(host: str, port: int):
    """The server's listening socket, bound now: a port already taken is a one-line error
    before a model is loaded, not after."""
    import socket

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise _CliError(f"--port {port}: cannot listen on {host}:{port} ({e.strerror})") from e
    return sock


def _from_hub(spec: str | None, args: argparse.Namespace, flag: str) -> str | None:
    """A repo id given with --revision or --download-dir (vLLM's), or a repo id for --tokenizer:
    its local snapshot, fetched once; anything else as given."""
    from pathlib import Path

    from lanes.models.resolve import hub_snapshot, is_repo_id

    if spec is None or Path(spec).expanduser().exists() or not is_repo_id(spec):
        return spec
    if flag == "--model" and args.revision is None and args.download_dir is None:
        return spec  # the usual path (open_checkpoint resolves it)
    revision = args.revision if flag == "--model" else None  # vLLM: --revision is the model's
    return str(hub_snapshot(spec, revision=revision, cache_dir=args.download_dir))


def _off_the_main_thread(fn, *args, **kwargs):
    """fn(*args, **kwargs) in a thread of its own, which then exits. torch's CPU threads are GNU
    OpenMP's: every thread that runs parallel ops keeps its own pool of workers, and once there
    are more of them than cores, libgomp puts its workers to sleep between parallel regions. The
    weights' load runs parallel ops; had it run on the main thread, the engine thread's would
    have run with two pools alive — 1.5-2x slower on the 2-core dev box (bench/NOTES.md). A
    thread that exits takes its pool with it."""
    import threading

    result: dict = {}

    def run() -> None:
        try:
            result["value"] = fn(*args, **kwargs)
        except BaseException as e:  # raised again on the caller's thread
            result["error"] = e

    # a daemon: Ctrl-C during a long download ends the process instead of waiting for the load
    thread = threading.Thread(target=run, name="lanes-load", daemon=True)
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


def with_tokenizer(model: str | None, tokenizer_dir: str, gguf_packed: bool = False):
    """The model's checkpoint with the tokenizer of another HF directory (vLLM's --tokenizer):
    it must not know ids past the model's vocabulary."""
    from pathlib import Path

    from lanes.models import open_checkpoint
    from lanes.tokenizer import Tokenizer

    checkpoint = open_checkpoint(model, gguf_packed)
    path = Path(tokenizer_dir)
    if not path.is_dir():
        raise _CliError(
            f"--tokenizer {tokenizer_dir}: not a directory (a local HF tokenizer) nor a repo id"
        )
    tokenizer = Tokenizer.from_hf_dir(path, checkpoint.config)
    if tokenizer.vocab_size > checkpoint.config.vocab_size:
        raise _CliError(
            f"--tokenizer {tokenizer_dir} has {tokenizer.vocab_size} tokens; the model has "
            f"{checkpoint.config.vocab_size}"
        )
    return dataclasses.replace(checkpoint, tokenizer=tokenizer)


def _kv_bytes_for(args: argparse.Namespace, model, device: str, size) -> int:
    """--gpu-memory-utilization: the KV pool per rank, from the GPU's memory and the weights'
    bytes (read from the checkpoint's shapes, without loading it)."""
    import torch

    from lanes.config import EngineConfig
    from lanes.models import open_checkpoint

    ckpt = open_checkpoint(model)
    dtype = getattr(torch, EngineConfig(dtype=args.dtype, device=device).torch_dtype_name)
    numel = sum(math.prod(shape) for shape in ckpt.shapes.values())
    weight_bytes = numel * dtype.itemsize // args.tensor_parallel
    return size(args.gpu_memory_utilization, device_memory(device), weight_bytes)


def serve_engine(
    engine,
    host: str,
    port: int,
    names: list[str],
    api_key: str | None,
    allow_special_tokens: bool = False,
    access_log: bool = True,
    log_requests: bool = True,
    allowed_origins: tuple[str, ...] = (),
    report_cached_tokens: bool = False,
    max_logprobs: int = 20,
    log_stats: bool = True,
    log_level: str = "info",
    root_path: str = "",
    sock=None,
    reasoning_parser: str | None = None,
    tool_call_parser: str | None = None,
) -> None:
    """Serve one engine (also rank 0 of a tensor-parallel group) until SIGINT or SIGTERM."""
    import logging

    import uvicorn

    from lanes.http_protocol import HeaderDeadlineH11
    from lanes.server import build_app

    config = engine.config
    app = build_app(
        engine,
        names,
        api_key=api_key,
        allow_special_tokens=allow_special_tokens,
        allowed_origins=allowed_origins,
        log_requests=log_requests,
        report_cached_tokens=report_cached_tokens,
        max_logprobs=max_logprobs,
        log_stats=log_stats,
        reasoning_parser=reasoning_parser,
        tool_call_parser=tool_call_parser,
    )
    tp = engine.comm.world if engine.comm is not None else 1
    logging.getLogger("lanes").info(
        "serving %s (%s) | drafter %s | %s on %s | %s mode | tensor parallel %d | KV %d tokens (%d blocks) | http://%s:%d/v1",
        ", ".join(names),
        engine.source,
        config.drafter,
        config.torch_dtype_name,
        config.device,
        "exact" if config.exact else "fast",
        tp,
        engine.pool.num_blocks * config.block_size,
        engine.pool.num_blocks,
        host,
        port,
    )
    runner = app.state.runner

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):  # end every lane now, so open streams close promptly
            runner.cancel_all()
            super().handle_exit(sig, frame)

    Server(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level=log_level,
            root_path=root_path,
            access_log=access_log,  # one line per request, as vLLM users expect to see
            timeout_graceful_shutdown=5,
            http=HeaderDeadlineH11,  # a connection's headers within 30 s, or it is closed
        )
    ).run(sockets=None if sock is None else [sock])


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()
