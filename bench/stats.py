"""Order statistics the benchmarks report."""

from __future__ import annotations


def percentile(values: list[float], q: float) -> float | None:
    """The q-quantile by rank (the value at index q * n of the sorted values, the last for
    q = 1); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
