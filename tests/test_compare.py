"""The regression gate flags a slowdown beyond the run-to-run spread, and only that."""

from __future__ import annotations

from bench.compare import compare


def _run(median, runs):
    return {"median": median, "runs": runs}


def test_flags_only_changes_beyond_noise():
    old = {
        "decode_tok_s": {"exact": _run(100.0, [99.0, 100.0, 101.0])},
        "prefill_s": _run(1.0, [0.99, 1.0, 1.01]),
    }
    same = {
        "decode_tok_s": {"exact": _run(99.5, [99.0, 99.5, 100.5])},
        "prefill_s": _run(1.005, [1.0, 1.005, 1.01]),
    }
    slower = {
        "decode_tok_s": {"exact": _run(90.0, [89.0, 90.0, 91.0])},
        "prefill_s": _run(1.2, [1.19, 1.2, 1.21]),
    }
    faster = {
        "decode_tok_s": {"exact": _run(120.0, [119.0, 120.0, 121.0])},
        "prefill_s": _run(0.8, [0.79, 0.8, 0.81]),
    }
    assert not any(r["regressed"] for r in compare(old, same, ("tok_s",), 0.0))
    flagged = {r["metric"] for r in compare(old, slower, ("tok_s",), 0.0) if r["regressed"]}
    assert flagged == {"decode_tok_s/exact", "prefill_s"}
    assert not any(r["regressed"] for r in compare(old, faster, ("tok_s",), 0.0))
    # a noisy baseline widens the band
    noisy = {"decode_tok_s": {"exact": _run(100.0, [80.0, 100.0, 120.0])}}
    assert not any(
        r["regressed"]
        for r in compare(
            noisy, {"decode_tok_s": {"exact": _run(90.0, [89.0, 90.0, 91.0])}}, ("tok_s",), 0.0
        )
    )
