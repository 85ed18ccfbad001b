"""PNG plots beside a result file: `python -m bench.plots bench/results/engine-h200.json`.

engine results: the speculative speedup surface and the prefill-share trade-off;
bench_openai results: the TTFT ladder and the decode ladder.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for name in sys.argv[1:]:
        path = Path(name)
        r = json.loads(path.read_text())
        if "spec" in r:
            fig, ax = plt.subplots(figsize=(6, 4))
            surface = r["spec"]["surface"]
            for a in sorted({p["acceptance_set"] for p in surface}):
                pts = [p for p in surface if p["acceptance_set"] == a]
                ax.plot(
                    [p["k"] for p in pts],
                    [p["speedup"] for p in pts],
                    marker="o",
                    label=f"acceptance {a}",
                )
            ax.axhline(1.0, color="grey", lw=0.8)
            ax.set(
                xlabel="max draft tokens k",
                ylabel="speedup over no drafter",
                title=f"{r['target']} + {r['drafter']}-shaped drafter, batch 1",
            )
            ax.legend(fontsize=7)
            fig.savefig(path.with_name(path.stem + "-spec.png"), dpi=120, bbox_inches="tight")
        if "share" in r:
            rows = r["share"]["rows"]
            fig, ax = plt.subplots(figsize=(6, 4))
            shares = [x["prefill_share"] for x in rows]
            ax.plot(
                shares,
                [x["long_prompt_ttft_median_s"] for x in rows],
                marker="o",
                label="long-prompt TTFT s",
            )
            ax.plot(
                shares,
                [1e3 * x["itl_p90_s"] / 100 for x in rows],
                marker="s",
                label="decode ITL p90 (x100 ms)",
            )
            ax2 = ax.twinx()
            ax2.plot(
                shares,
                [x["output_tok_s"] for x in rows],
                color="green",
                marker="^",
                label="output tok/s",
            )
            ax.set(
                xlabel="--prefill-share",
                title="mixed workload: long prompts arriving while lanes decode",
            )
            ax.legend(loc="upper center", fontsize=7)
            ax2.legend(loc="upper right", fontsize=7)
            fig.savefig(path.with_name(path.stem + "-share.png"), dpi=120, bbox_inches="tight")
        if "ttft" in r or "decode" in r:
            fig, axes = plt.subplots(1, 2, figsize=(10, 4))
            if "ttft" in r:
                axes[0].plot(
                    [x["prompt_tokens"] for x in r["ttft"]],
                    [x["ttft_median_s"] for x in r["ttft"]],
                    marker="o",
                )
                axes[0].set(xscale="log", xlabel="prompt tokens", ylabel="TTFT s")
            if "decode" in r:
                axes[1].plot(
                    [x["concurrency"] for x in r["decode"]],
                    [x["output_tok_s"] for x in r["decode"]],
                    marker="o",
                )
                axes[1].set(xscale="log", xlabel="concurrency", ylabel="output tok/s")
            fig.savefig(path.with_name(path.stem + "-ladders.png"), dpi=120, bbox_inches="tight")
        plt.close("all")


if __name__ == "__main__":
    main()
