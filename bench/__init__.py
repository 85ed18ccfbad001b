"""Benchmarks and GPU harnesses, by question (run from the repository root):

python -m bench                      lists every question and its subcommands
python -m bench.<question> <sub> …   runs one (`--help` for its options)
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the repository
RESULTS = ROOT / "bench" / "results"
DATA = ROOT / "bench" / "data"
