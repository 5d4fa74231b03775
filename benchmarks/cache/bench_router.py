"""Routers across simulated replicas (issue 19 items 4-5): hit rate and load balance against one big cache.

For each trace and each fleet size N, runs `replay_fleet` (radixkv/replay/fleet.py: N replicas, each its
own Scheduler + RadixCache + pool of --pages pages, placed by the router; arrivals at their timestamps,
the default cost model and scheduler) with the routers prefix, round-robin and least-loaded, and the
upper bound a perfect router approaches: one replica whose cache holds all N pools' pages (N x --pages),
the same simulated replay. Also the same big cache replayed sequentially (file order, one request at a
time: the exact cache-only figure).

Pools are small so that placement matters: 3,000 pages per replica. Pages are the trace's own block
(Mooncake: 512 tokens, 1.5M tokens a replica) or, for WEKA, 256 tokens (4 of its 64-token blocks;
768k tokens a replica: a round pool size that still admits its largest request, 623k tokens).

    PYTHONPATH=. python benchmarks/cache/bench_router.py [--traces mooncake weka] [--replicas 4 8] \
        [--pages 3000] [--json benchmarks/results/router.json]
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from radixkv.replay.fleet import replay_fleet
from radixkv.replay.replay import ReplayConfig, run_replay
from radixkv.replay.router import RouterKind
from radixkv.workloads.trace_loading import load_trace

SHARED = Path(os.environ.get("RADIXKV_SHARED", Path(__file__).resolve().parents[3] / "shared"))
TRACES = {  # name -> (path, page size)
    "mooncake": (SHARED / "traces/mooncake/synthetic_trace.jsonl", 512),
    "weka": (SHARED / "traces/weka_claude_code", 256),
}
ROUTERS = [RouterKind.PREFIX, RouterKind.ROUND_ROBIN, RouterKind.LEAST_LOADED]


def run_trace(name: str, replicas: list[int], pages: int) -> list[dict]:
    path, page_size = TRACES[name]
    requests = load_trace(path).requests
    rows = []
    for n in replicas:
        cfg = ReplayConfig(page_size=page_size, num_pages=pages)
        for kind in ROUTERS:
            t0 = time.perf_counter()
            res, fleet = replay_fleet(requests, cfg, n, kind)
            rows.append(dict(trace=name, replicas=n, router=kind.value, page_size=page_size, pages_per_replica=pages,
                             hit_rate=res.hit_rate, completed=res.completed, rejected=res.rejected,
                             preemptions=res.preemptions, leaked_pages=res.leaked_pages,
                             per_replica_hit_rate=fleet.per_replica_hit_rate,
                             per_replica_requests=[r.requests for r in fleet.replicas],
                             load_max_over_mean=fleet.load_max_over_mean, wait_p99_s=res.wait_p99_s,
                             wall_s=time.perf_counter() - t0))
            print(f"# {name} N={n} {kind.value}: hit {res.hit_rate:.4f} load {fleet.load_max_over_mean:.3f}",
                  flush=True)
        for mode, sequential in (("one big cache (simulated)", False), ("one big cache (sequential)", True)):
            t0 = time.perf_counter()
            big = run_replay(requests, ReplayConfig(page_size=page_size, num_pages=n * pages, sequential=sequential))
            rows.append(dict(trace=name, replicas=n, router=mode, page_size=page_size, pages_per_replica=n * pages,
                             hit_rate=big.hit_rate, completed=big.completed, rejected=big.rejected,
                             preemptions=big.preemptions, leaked_pages=big.leaked_pages, load_max_over_mean=None,
                             wait_p99_s=big.wait_p99_s, wall_s=time.perf_counter() - t0))
            print(f"# {name} N={n} {mode}: hit {big.hit_rate:.4f}", flush=True)
    return rows


def table(rows: list[dict]) -> str:
    """Markdown table: each router's hit rate against the simulated one-big-cache and round-robin."""
    ref = {(r["trace"], r["replicas"], r["router"]): r["hit_rate"] for r in rows}
    out = ["| trace | N | router | hit rate | / one big cache | / round-robin | max/mean load | "
           "per-replica hit min-max | p99 wait s |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        big = ref[(r["trace"], r["replicas"], "one big cache (simulated)")]
        rr = ref[(r["trace"], r["replicas"], "round-robin")]
        per = r.get("per_replica_hit_rate")
        out.append(f"| {r['trace']} | {r['replicas']} | {r['router']} | {r['hit_rate']:.4f} | "
                   f"{r['hit_rate'] / big:.3f} | {r['hit_rate'] / rr:.2f}x | "
                   + (f"{r['load_max_over_mean']:.3f}" if r["load_max_over_mean"] is not None else "-")
                   + " | " + (f"{min(per):.3f}-{max(per):.3f}" if per else "-")
                   + f" | {r['wait_p99_s']:.1f} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", nargs="+", choices=list(TRACES), default=list(TRACES))
    ap.add_argument("--replicas", nargs="+", type=int, default=[4, 8])
    ap.add_argument("--pages", type=int, default=3000, help="pages per replica")
    ap.add_argument("--json", type=Path, default=None, help="write the rows here")
    a = ap.parse_args()
    rows = [row for name in a.traces for row in run_trace(name, a.replicas, a.pages)]
    print(table(rows))
    if a.json:
        a.json.write_text(json.dumps({"command": "PYTHONPATH=. python benchmarks/cache/bench_router.py "
                                                 f"--traces {' '.join(a.traces)} --replicas "
                                                 f"{' '.join(map(str, a.replicas))} --pages {a.pages}",
                                      "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
