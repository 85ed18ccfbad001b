"""The `lanes` command line. Errors end in one line on stderr and exit status 2."""

from __future__ import annotations

import argparse
import json
import sys
import time


def _generate(args: argparse.Namespace) -> int:
    from lanes.config import EngineConfig
    from lanes.engine import Engine
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
    )
    engine = Engine(args.model, config)
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


def _serve(args: argparse.Namespace) -> int:
    raise _CliError("`lanes serve` is not built yet (issue 5); use `lanes generate` for now")


class _CliError(Exception):
    pass


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lanes", description="exact speculative LLM serving")
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
    gen.add_argument("--device", default="cpu")
    gen.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    gen.add_argument("--fast", action="store_true", help="plain torch ops (not batch-invariant)")
    gen.add_argument("--json", action="store_true", help="print token ids and text as JSON")
    gen.set_defaults(run=_generate)

    serve = sub.add_parser("serve", help="OpenAI-compatible server (not built yet)")
    serve.add_argument("--model", default=None)
    serve.add_argument("--drafter", default="none")
    serve.set_defaults(run=_serve)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (_CliError, ValueError, OSError) as e:
        print(f"lanes: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
