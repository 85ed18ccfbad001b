"""`python -m bench.<question> <subcommand> [options]`: each question is a folder of bench/, each
subcommand one module in it, run as if it were `python -m bench.<question>.<module>`."""

from __future__ import annotations

import ast
import runpy
import sys
from pathlib import Path

QUESTIONS = {
    "speed": "how fast the engine runs: decode, prefill, rounds, overlap, device rounds",
    "serving": "a server under load, bad input and long runs (OpenAI-compatible clients)",
    "drafters": "what drafting buys: speedups, acceptance, agreement",
    "kernels": "each kernel against its reference, and its time",
    "cpu": "lanes against llama.cpp on the CPU",
    "profile": "where the time goes: profiler windows and traces",
}


def subcommands(question: str) -> dict[str, str]:
    """Subcommand name -> the first line of its module's docstring."""
    folder = Path(__file__).parent / question
    out = {}
    for path in sorted(folder.glob("*.py")):
        if path.name.startswith("_"):
            continue
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        out[path.stem.replace("_", "-")] = doc.split("\n")[0]
    return out


def run(question: str, argv: list[str]) -> int:
    subs = subcommands(question)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in subs:
        if argv and argv[0] not in ("-h", "--help"):
            print(f"bench.{question}: no subcommand {argv[0]!r}", file=sys.stderr)
        print(f"python -m bench.{question} <subcommand> [--help]\n\n{QUESTIONS[question]}\n")
        for name, line in subs.items():
            print(f"  {name:<20} {line}")
        return 0 if not argv or argv[0] in ("-h", "--help") else 2
    module = f"bench.{question}.{argv[0].replace('-', '_')}"
    sys.argv = [module, *argv[1:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0
