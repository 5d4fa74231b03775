"""Plot benchmarks/engine/bench_e2e_gpu.py's rows: output tokens/s by configuration, one panel a workload.

    python benchmarks/engine/plot_e2e.py benchmarks/results/e2e.json docs/e2e_throughput.png

Workload panels (few-shot, multi-turn, trace, no-sharing) have one bar per configuration, its value
written on it; hf-generate bars are hatched and name how many requests they timed (a subset). A
decode-sweep panel (tokens/s against batch, CUDA graphs, greedy) is added when the JSON has its rows.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

WORKLOADS = ("few-shot", "multi-turn", "trace", "no-sharing")
CONFIGS = ("cache-on-bf16", "cache-off-bf16", "cache-on-fp8", "hf-generate")
COLORS = {"cache-on-bf16": "#1f77b4", "cache-off-bf16": "#ff7f0e", "cache-on-fp8": "#2ca02c",
          "hf-generate": "#7f7f7f"}


def plot(rows: list[dict], out: str, title: str | None = None) -> None:
    work = {w: {r["config"]: r for r in rows if r.get("workload") == w and r.get("output_tokens_per_s") is not None}
            for w in WORKLOADS}
    work = {w: v for w, v in work.items() if v}
    sweep = [r for r in rows if r.get("workload") == "decode-sweep" and r.get("graphs", True)
             and not r.get("sampled", False)]
    n = len(work) + bool(sweep)
    if n == 0:
        raise SystemExit("no workload or decode-sweep rows with output_tokens_per_s in the JSON")
    fig, axes = plt.subplots(1, n, figsize=(3.6 * n, 3.8), squeeze=False)
    axes = list(axes[0])
    for ax, (w, by_config) in zip(axes, work.items()):
        configs = [c for c in CONFIGS if c in by_config]
        vals = [by_config[c]["output_tokens_per_s"] for c in configs]
        bars = ax.bar(range(len(configs)), vals, color=[COLORS[c] for c in configs],
                      hatch=None, edgecolor="black", linewidth=0.5)
        for b, c, v in zip(bars, configs, vals):
            r = by_config[c]
            if c == "hf-generate":
                b.set_hatch("//")
            label = f"{v:,.0f}"
            if c == "hf-generate" or r.get("subset"):
                label += f"\n({r.get('requests')} req)"
            ax.annotate(label, (b.get_x() + b.get_width() / 2, v), ha="center", va="bottom", fontsize=7,
                        xytext=(0, 2), textcoords="offset points")
        ax.set_xticks(range(len(configs)), [c.replace("-", "\n", 1) for c in configs], fontsize=7)
        reqs = max((by_config[c].get("requests") or 0) for c in configs if c != "hf-generate") if any(
            c != "hf-generate" for c in configs) else None
        ax.set_title(w + (f" ({reqs} requests)" if reqs else ""), fontsize=9)
        ax.set_ylabel("output tokens/s", fontsize=8)
        ax.tick_params(axis="y", labelsize=7)
        ax.set_ylim(0, max(vals) * 1.25)
        ax.grid(axis="y", alpha=0.3)
    if sweep:
        ax = axes[-1]
        for c in ("cache-on-bf16", "cache-on-fp8"):
            pts = sorted((r["batch"], r["output_tokens_per_s"]) for r in sweep if r.get("config") == c)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=COLORS[c], label=c)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch", fontsize=8)
        ax.set_ylabel("output tokens/s", fontsize=8)
        ax.set_title("decode sweep (graphs, greedy)", fontsize=9)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.suptitle(title or "radixkv end to end: output tokens/s by configuration", fontsize=10)
    fig.tight_layout()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=130)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("json", help="rows written by bench_e2e_gpu.py --json")
    ap.add_argument("png", help="output image, e.g. docs/e2e_throughput.png")
    ap.add_argument("--title", default=None)
    a = ap.parse_args()
    plot(json.loads(Path(a.json).read_text()), a.png, a.title)
    print(f"wrote {a.png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
