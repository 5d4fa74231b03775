"""Replay plot: cumulative prefix hit rate and pool occupancy over time (matplotlib, Agg)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .replay import ReplayResult

_MAX_POINTS = 4000  # plotted points; longer timelines are thinned evenly


def plot_replay(result: ReplayResult, path: str | Path, title: str | None = None) -> Path:
    """Draw hit rate (left axis) and pages in use (right axis) against the replay clock to PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = np.asarray(result.timeline, dtype=np.float64).reshape(-1, 3)  # [N, (now, hit_rate, pages)]
    if len(pts) > _MAX_POINTS:
        pts = pts[np.linspace(0, len(pts) - 1, _MAX_POINTS).astype(np.int64)]
    fig, ax = plt.subplots(figsize=(8, 4.2), dpi=120)
    clock = "wall s" if result.mode.value == "real" else "simulated s"
    ax.plot(pts[:, 0], pts[:, 1], color="tab:blue", label="prefix hit rate (cumulative)")
    ax.set_ylim(0, 1)
    ax.set_xlabel(f"time ({clock})")
    ax.set_ylabel("hit rate (tokens)", color="tab:blue")
    ax2 = ax.twinx()
    ax2.plot(pts[:, 0], pts[:, 2], color="tab:orange", alpha=0.8, label="pages in use")
    ax2.axhline(result.num_pages, color="tab:orange", ls=":", lw=1, label="pool size")
    ax2.set_ylim(0, max(result.num_pages, int(pts[:, 2].max()) if len(pts) else 1) * 1.05)
    ax2.set_ylabel(f"pages in use (page = {result.page_size} tokens)", color="tab:orange")
    lines = ax.get_lines() + ax2.get_lines()
    ax.legend(lines, [ln.get_label() for ln in lines], loc="lower right", fontsize=8)
    ax.set_title(title or f"radixkv replay ({result.mode.value}): hit rate {result.hit_rate:.4f}, "
                          f"peak {result.peak_pages} pages")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out)
    plt.close(fig)
    return out
