"""The `lanes` command line. Errors end in one line on stderr and exit status 2."""

from __future__ import annotations

import argparse
import difflib
import json
import sys
import time

from lanes.serve_command import (  # noqa: F401  (with_tokenizer, _off_the_main_thread: tests)
    _off_the_main_thread,
    _serve,
    with_tokenizer,
)
from lanes.serve_options import (  # noqa: F401  (_CliError: tests)
    _CliError,
    byte_size,
    device_name,
    dtype_name,
    origins,
    port_number,
    positive_bytes,
    positive_int,
)
from lanes.vllm_flags import add_vllm_flags, model_len


def _generate(args: argparse.Namespace) -> int:
    from lanes.build import build_engine
    from lanes.config import EngineConfig
    from lanes.sampling import SamplingParams

    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        stop=tuple(args.stop or ()),
    )
    config = EngineConfig(
        device=args.device,
        dtype=args.dtype,
        exact=not args.fast,
        drafter=args.drafter,
        num_draft_tokens=args.num_draft_tokens,
        draft_branches=args.draft_branches,
        gguf_packed=args.gguf_packed,
    )
    engine = build_engine(args.model, config)
    use_chat = engine.tokenizer.chat_template and not args.raw
    prompt = [{"role": "user", "content": args.prompt}] if use_chat else args.prompt
    start = time.perf_counter()
    (out,) = engine.generate([prompt], params)
    seconds = time.perf_counter() - start
    if args.json:
        print(
            json.dumps(
                {
                    "prompt_ids": out.prompt_ids,
                    "token_ids": out.token_ids,
                    "text": out.text,
                    "finish_reason": out.finish_reason,
                    "seconds": round(seconds, 3),
                    "draft_tokens": out.num_drafted,
                    "accepted_draft_tokens": out.num_accepted,
                }
            )
        )
    else:
        print(out.text)
    return 0


def _distill(args: argparse.Namespace) -> int:
    from pathlib import Path

    from lanes.drafter.distill import distill

    report = distill(
        args.target,
        Path(args.out),
        num_prompts=args.prompts,
        num_answered=args.answered,
        held_out=args.held_out,
        new_tokens=args.new_tokens,
        depth=args.depth,
        steps=args.steps,
        batch=args.batch,
        lr=args.lr,
        draft_vocab=args.draft_vocab,
        device=args.device,
        teacher_batch=args.teacher_batch,
        answered_share=args.answered_share,
        seed=args.seed,
        max_train_seconds=args.max_train_seconds,
        max_teacher_seconds=args.max_teacher_seconds,
        answers_file=Path(args.answers) if args.answers else None,
        answers_only=args.answers_only,
        features=args.features,
        everyday=args.everyday,
        everyday_file=Path(args.everyday_file) if args.everyday_file else None,
        log=lambda m: print(m, file=sys.stderr, flush=True),
    )
    summary = {k: v for k, v in report.items() if k != "losses"}
    print(json.dumps(summary, indent=2))
    return 0


def _tokenizer(args: argparse.Namespace) -> int:
    """`lanes tokenizer MODEL --out DIR`: e.g. the default model's tokenizer, which lives only
    inside its GGUF, for guidellm's --processor or aiperf's --tokenizer."""
    from pathlib import Path

    from lanes.models import open_checkpoint

    if args.model_arg and args.model and args.model_arg != args.model:
        raise _CliError(f"two models given: {args.model_arg!r} and --model {args.model!r}")
    checkpoint = open_checkpoint(args.model_arg or args.model)
    for path in checkpoint.tokenizer.save(Path(args.out)):
        print(path)
    return 0


def _models(args: argparse.Namespace) -> int:
    """`lanes models`: where the default model's weights and tokenizer files are (the tokenizer
    of the GGUF written out as HF files first, if it is not yet)."""
    from lanes.config import cache_dir
    from lanes.models import resolve

    snapshot = resolve.cached_snapshot(resolve.DEFAULT_MODEL)
    gguf = cache_dir() / resolve.DEFAULT_GGUF
    print(f"default model  {resolve.DEFAULT_MODEL}")
    if snapshot is not None:
        print(f"  weights      {snapshot} (the Hugging Face cache)")
        print(f"  tokenizer    {snapshot}")
    elif gguf.is_file():
        tokenizer = resolve.export_tokenizer(
            lambda: resolve.open_gguf(gguf), resolve.default_tokenizer_dir()
        )
        print(f"  weights      {gguf}")
        print(
            f"  tokenizer    {tokenizer} (guidellm --processor, aiperf --tokenizer, transformers)"
        )
    else:
        print("  weights      not fetched yet: the first `lanes serve` or `lanes generate` does")
    print(f"lanes cache    {cache_dir()} ($LANES_CACHE)")
    return 0


def _kernels(args: argparse.Namespace) -> int:
    """The kernel registry, with each kernel's last GPU check from bench/results/."""
    from pathlib import Path

    from lanes.kernels.registry import REGISTRY

    results = Path(__file__).resolve().parent.parent / "bench" / "results" / "kernels-gpu.json"
    gpu = json.loads(results.read_text()) if results.is_file() else {}
    checked = gpu.get("kernels", {})
    print(f"{'kernel':16} {'invariant':9} {'dtypes':26} last GPU check")
    for spec in REGISTRY:
        dtypes = ",".join(str(d).removeprefix("torch.") for d in spec.dtypes)
        last = checked.get(spec.name)
        when = f"{gpu['date']} {gpu['gpu']}: {last['result']}" if last else "never"
        print(f"{spec.name:16} {'yes' if spec.batch_invariant else 'no':9} {dtypes:26} {when}")
        print(f"{'':16} {spec.limits}")
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse, with "did you mean" for a mistyped flag (the command's own flags)."""

    def error(self, message: str):
        unknown = message.removeprefix("unrecognized arguments: ")
        if unknown != message:
            argv = getattr(self, "argv", None) or sys.argv[1:]
            command = next((a for a in argv if not a.startswith("-")), "")
            known = _options(self, command)
            hints = []
            for arg in unknown.split():
                close = difflib.get_close_matches(arg.split("=")[0], known, n=1, cutoff=0.6)
                hints += [f"{arg} (did you mean {close[0]}?)"] if close else [arg]
            message = "unrecognized arguments: " + " ".join(hints)
        super().error(message)


def _options(parser: argparse.ArgumentParser, command: str) -> list[str]:
    """The option strings of `command` (or of every command), for suggestions."""
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if not command or name == command or command not in action.choices:
                    out += [o for a in sub._actions for o in a.option_strings]
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="lanes", description="exact speculative LLM serving")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="complete one prompt and print the result")
    gen.add_argument("--model", default=None, help="HF dir, .gguf, or repo id (default: SmolLM2)")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--stop", action="append", help="stop string (repeatable)")
    gen.add_argument(
        "--raw", action="store_true", help="no chat template, even if the model has one"
    )
    gen.add_argument("--drafter", default="none", help="none, ngram, or a drafter model")
    gen.add_argument("--num-draft-tokens", type=int, default=4)
    gen.add_argument(
        "--draft-branches", type=int, default=1,
        help="draft trees: an EAGLE-style head's chains per lane, each led by one of its best "
        "first drafts, verified in one forward (1: a chain; eager forwards only for now)",
    )  # fmt: skip
    gen.add_argument("--device", default="cpu")
    gen.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    gen.add_argument("--fast", action="store_true", help="plain torch ops (not batch-invariant)")
    gen.add_argument(
        "--gguf-packed",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="keep a .gguf's Q4_0/Q4_1/Q8_0 weights as codes (default: on the CPU in exact "
        "mode, where a C kernel reads them; elsewhere dequantized at load)",
    )
    gen.add_argument("--json", action="store_true", help="print token ids and text as JSON")
    gen.set_defaults(run=_generate)

    dist = sub.add_parser("distill", help="train a drafter for a target on its own outputs")
    dist.add_argument("--target", default=None, help="target model (default: SmolLM2)")
    dist.add_argument("--out", required=True, help="directory for the drafter")
    dist.add_argument("--prompts", type=int, default=1024, help="training sequences")
    dist.add_argument(
        "--answered", type=int, default=256, help="of them, prompts the target answers itself"
    )
    dist.add_argument("--held-out", type=int, default=32, help="prompts for the acceptance check")
    dist.add_argument("--new-tokens", type=int, default=128, help="tokens the target answers")
    dist.add_argument("--depth", type=int, default=3, help="draft steps unrolled in training")
    dist.add_argument("--steps", type=int, default=1000)
    dist.add_argument("--batch", type=int, default=16)
    dist.add_argument("--lr", type=float, default=5e-4)
    dist.add_argument("--draft-vocab", type=int, default=16384, help="0: the whole vocabulary")
    dist.add_argument(
        "--teacher-batch", type=int, default=256, help="prompts the target answers at once"
    )
    dist.add_argument(
        "--answered-share", type=float, default=0.75, help="share of each batch from answers"
    )
    dist.add_argument("--seed", type=int, default=0)
    dist.add_argument(
        "--max-train-seconds",
        type=float,
        default=0,
        help="stop training after this long (0: no cap)",
    )
    dist.add_argument(
        "--max-teacher-seconds",
        type=float,
        default=0,
        help="stop the target's answers after this long",
    )
    dist.add_argument(
        "--answers",
        default=None,
        help="gzipped JSON-lines file of the target's answers: read back, new ones appended",
    )
    dist.add_argument(
        "--answers-only", action="store_true", help="only make the target's answers (--answers)"
    )
    dist.add_argument(
        "--features",
        default="layers",
        choices=["layers", "final"],
        help="target features the drafter reads: low+middle+final layers, or the final alone",
    )
    dist.add_argument(
        "--everyday",
        type=int,
        default=0,
        help="more prompts, written by the target from seed topics, all answered",
    )
    dist.add_argument(
        "--everyday-file", default=None, help="JSON file keeping the everyday prompts (reread)"
    )
    dist.add_argument("--device", default="cpu")
    dist.set_defaults(run=_distill)

    models = sub.add_parser("models", help="where the default model and its tokenizer files are")
    models.set_defaults(run=_models)

    kern = sub.add_parser("kernels", help="list the Triton kernels and their last GPU check")
    kern.set_defaults(run=_kernels)

    tok = sub.add_parser(
        "tokenizer",
        help="write a model's tokenizer as an HF tokenizer directory (for benchmark clients)",
    )
    tok.add_argument("model_arg", nargs="?", default=None, metavar="MODEL", help="as --model")
    tok.add_argument("--model", default=None, help="HF dir, .gguf, or repo id (default: SmolLM2)")
    tok.add_argument("--out", required=True, help="the directory to write")
    tok.set_defaults(run=_tokenizer)

    serve = sub.add_parser("serve", help="OpenAI-compatible HTTP server")
    model = serve.add_argument_group("model")
    spec = serve.add_argument_group("speculative decoding")
    sched = serve.add_argument_group("scheduling")
    memory = serve.add_argument_group("memory (KV pool, prompt cache)")
    http = serve.add_argument_group("HTTP server and logs")
    model.add_argument("model_arg", nargs="?", default=None, metavar="MODEL", help="as --model")
    model.add_argument("--model", default=None, help="HF dir, .gguf, or repo id (default: SmolLM2)")
    model.add_argument(
        "--served-model-name",
        nargs="+",
        default=None,
        help="the model id(s) clients send; the first labels metrics (default: --model)",
    )
    model.add_argument(
        "--tokenizer",
        default=None,
        help="an HF tokenizer directory to use instead of the model's own",
    )
    model.add_argument(
        "--chat-template", default=None, help="a Jinja chat template, or a file holding one"
    )
    model.add_argument(
        "--max-model-len",
        type=model_len,
        default=None,
        help="context limit (at most the model's): 32768, 32k (32,000) or 32K (32,768)",
    )
    model.add_argument(
        "--dtype",
        type=dtype_name,
        default="auto",
        help="auto, bfloat16, float16 (half) or float32 (float)",
    )
    model.add_argument(
        "--device", type=device_name, default=None, help="cpu or cuda (default: cuda if present)"
    )
    model.add_argument(
        "--gguf-packed",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="keep a .gguf's Q4_0/Q4_1/Q8_0 weights as codes (default: on the CPU in exact "
        "mode, where a C kernel reads them; elsewhere dequantized at load)",
    )
    model.add_argument(
        "--tensor-parallel",
        "--tensor-parallel-size",
        "-tp",
        type=positive_int,
        default=1,
        help="ranks (processes; one GPU each on CUDA)",
    )
    mode = model.add_mutually_exclusive_group()
    mode.add_argument(
        "--exact", action="store_true", default=True, help="batch-invariant ops (default)"
    )
    mode.add_argument("--fast", action="store_true", help="plain torch ops (not batch-invariant)")
    model.add_argument(
        "--delta-rule", choices=("recurrent", "chunked"), default="recurrent",
        help="hybrids' gated DeltaNet layers: row by row, or in 64-row chunks at absolute "
        "positions (Triton kernels; such models then run without CUDA graphs)",
    )  # fmt: skip
    spec.add_argument("--drafter", default="none", help="none, ngram, or a drafter model")
    spec.add_argument("--num-draft-tokens", type=int, default=4)
    spec.add_argument(
        "--draft-branches", type=int, default=1,
        help="draft trees: an EAGLE-style head's chains per lane, each led by one of its best "
        "first drafts, verified in one forward (1: a chain; eager forwards only for now)",
    )  # fmt: skip
    spec.add_argument(
        "--speculative-config",
        default=None,
        help='vLLM-style JSON: {"method": "ngram"} or {"model": DIR}, "num_speculative_tokens"',
    )
    spec.add_argument(
        "--device-rounds",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="keep an EAGLE-style head's greedy drafted rounds on the device, one CUDA graph "
        "per round (default: where CUDA graphs run)",
    )
    sched.add_argument("--max-lanes", "--max-num-seqs", type=int, default=16)
    sched.add_argument(
        "--max-tokens-per-round",
        "--max-num-batched-tokens",
        type=positive_int,
        default=None,
        help="tokens (decode rows and prompt chunks) one round may carry (default 2048)",
    )
    sched.add_argument("--prefill-share", type=float, default=0.5)
    sched.add_argument(
        "--prefill-bursts",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="when as many requests wait for a first token as decode, compute those prompts "
        "first whatever --prefill-share (default on)",
    )
    sched.add_argument(
        "--overlap",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="launch each greedy decode round before the last one's tokens are read back "
        "(default: on CUDA)",
    )
    sched.add_argument(
        "--prefetch-masks",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="compute each step's first grammar mask on a helper thread while the forward runs "
        "(default off: where measured it did not pay; docs/serving.md)",
    )
    sched.add_argument("--seed", type=int, default=None, help="seed for unseeded sampled requests")
    memory.add_argument(
        "--kv-cache-bytes", type=positive_bytes, default=None, help="bytes, or 1GiB, 512MiB, 2G"
    )
    memory.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=None,
        help="CUDA: size the KV pool so the engine uses this share of the GPU's memory",
    )
    memory.add_argument("--prompt-cache-bytes", type=byte_size, default=256 * 2**20)
    memory.add_argument(
        "--state-snapshot-bytes",
        type=byte_size,
        default=256 * 2**20,
        help="hybrid (Qwen3.5) models: recurrent-state snapshots kept for cached prefixes",
    )
    http.add_argument("--host", default="127.0.0.1")
    http.add_argument("--port", type=port_number, default=8000)
    http.add_argument(
        "--api-key",
        action="append",
        default=None,
        help="require 'Authorization: Bearer KEY' (repeat the flag for several keys); each "
        "key's requests see only their own prompt cache entries (default: $LANES_API_KEY, "
        "comma-separated, else no key)",
    )
    http.add_argument(
        "--allowed-origins",
        type=origins,
        default=(),
        help='browser origins CORS lets in: a JSON list or comma-separated, "*" for any '
        "(default: none, so no web page can drive the server)",
    )
    http.add_argument(
        "--enable-prompt-tokens-details",
        action="store_true",
        help="report usage.prompt_tokens_details.cached_tokens (off by default: it tells a "
        "client which prompt prefixes others sent; see docs/serving.md)",
    )
    http.add_argument(
        "--allow-special-tokens",
        action="store_true",
        help="let chat messages spell control tokens (refused by default: they could fake a turn)",
    )
    http.add_argument(
        "--disable-uvicorn-access-log", action="store_true", help="no HTTP access log line"
    )
    http.add_argument(
        "--disable-log-requests",
        action="store_true",
        help="no line per finished request (outcome, tokens, TTFT, duration)",
    )
    add_vllm_flags(
        serve.add_argument_group(
            "vLLM's flags (each does what it does in vLLM, or lanes says at startup what it does "
            "instead)"
        )
    )
    serve.set_defaults(run=_serve)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    parser.argv = argv  # the command line, for "did you mean" (sys.argv where None)
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except (_CliError, ValueError, OSError) as e:
        print(f"lanes: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
