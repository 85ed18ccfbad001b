"""Benchmarks and GPU harnesses (run from the repository root: python -m bench.<name>)."""
