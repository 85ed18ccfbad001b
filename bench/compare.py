"""Regression gate: compare two benchmark result files (two commits, or lanes against a release).

    python -m bench.compare A.json B.json [--higher-is-better tok_s,output_tok_s] [--slack 0.0]

Walks both JSON trees; every entry holding "runs" (a list of repeated measurements) and a
"median" is compared. A change counts as a regression only beyond the measured run-to-run spread:
the larger of the two files' (max - min) / median for that entry, plus --slack. Keys whose name
contains one of --higher-is-better are throughputs (lower is worse); the rest are times (higher
is worse). Exits 1 when anything regressed, so CI or a script can gate on it.
"""

from __future__ import annotations

import argparse
import json
import sys


def entries(tree, path=()):
    """(path, median, runs) for every measured entry."""
    if isinstance(tree, dict):
        if "median" in tree and isinstance(tree.get("runs"), list) and tree["runs"]:
            yield path, float(tree["median"]), [float(r) for r in tree["runs"]]
        for k, v in tree.items():
            yield from entries(v, (*path, str(k)))


def spread(median: float, runs: list[float]) -> float:
    return (max(runs) - min(runs)) / median if median else 0.0


def compare(a: dict, b: dict, higher: tuple[str, ...], slack: float) -> list[dict]:
    old = {p: (m, r) for p, m, r in entries(a)}
    rows = []
    for path, m_new, runs_new in entries(b):
        if path not in old:
            continue
        m_old, runs_old = old[path]
        noise = max(spread(m_old, runs_old), spread(m_new, runs_new)) + slack
        change = (m_new - m_old) / m_old if m_old else 0.0
        better_high = any(h in "/".join(path) for h in higher)
        worse = -change if better_high else change
        rows.append(
            {
                "metric": "/".join(path),
                "old": m_old,
                "new": m_new,
                "change": change,
                "noise": noise,
                "regressed": worse > noise,
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--higher-is-better", default="tok_s")
    ap.add_argument("--slack", type=float, default=0.0)
    args = ap.parse_args()
    with open(args.old) as f_old, open(args.new) as f_new:
        rows = compare(
            json.load(f_old), json.load(f_new), tuple(args.higher_is_better.split(",")), args.slack
        )
    for r in rows:
        flag = "REGRESSED" if r["regressed"] else "ok"
        print(
            f"{flag:9} {r['metric']:50} {r['old']:.4g} -> {r['new']:.4g} ({r['change']:+.1%}, noise {r['noise']:.1%})"
        )
    if not rows:
        print("no comparable measurements")
    sys.exit(1 if any(r["regressed"] for r in rows) else 0)


if __name__ == "__main__":
    main()
