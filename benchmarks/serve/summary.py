"""Issue 31's serving figures in one short table, from the result JSONs (any machine, no torch).

    python benchmarks/serve/summary.py [--dir benchmarks/results]

Reads serve_load.json, cold_start.json, sharegpt_offline.json and e2e.json (whichever exist) and prints,
against issue 31's targets: the load sweep (ITL p90 / p99 over the decode step at the same batch), the
cold start (first / steady TTFT), ShareGPT offline throughput, few-shot default against cache-off.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench_common import REPO, table


def load(path: Path) -> list[dict]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return []


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", default=str(REPO / "benchmarks" / "results"), help="folder of the result JSONs")
    d = Path(p.parse_args().dir)

    load_rows = load(d / "serve_load.json")
    if load_rows:
        for r in load_rows:
            step = r.get("decode_step_ms")
            r["p90_x"] = r["itl_p90_ms"] / step if step else None
            r["p99_x"] = r["itl_p99_ms"] / step if step else None
        load_rows.sort(key=lambda r: (r["workload"], r.get("mode", ""), r["rate"]))
        print("== load sweep (serve_load.json); target at 48 req/s shared-prefix: ITL p90 <= 2x, p99 <= 4x the step")
        print(table(load_rows, [("workload", "workload", ""), ("mode", "mode", ""), ("rate", "req/s", "g"),
                                ("running_mean", "running", ".1f"), ("ttft_p50_ms", "TTFT p50", ".0f"),
                                ("ttft_p99_ms", "TTFT p99", ".0f"), ("itl_p50_ms", "ITL p50", ".1f"),
                                ("itl_p90_ms", "ITL p90", ".1f"), ("itl_p99_ms", "ITL p99", ".1f"),
                                ("decode_step_ms", "step", ".2f"), ("p90_x", "p90/step", ".2f"),
                                ("p99_x", "p99/step", ".2f"), ("output_tok_s", "out tok/s", ".0f"),
                                ("goodput", "goodput", ".0%")]))
        for r in load_rows:
            if r["workload"] == "shared-prefix" and r["rate"] == 48 and r["p90_x"] is not None:
                ok = r["p90_x"] <= 2 and r["p99_x"] <= 4
                print(f"  48 req/s {r.get('mode')}: p90 {r['p90_x']:.2f}x, p99 {r['p99_x']:.2f}x the step: "
                      f"{'met' if ok else 'NOT met'}")
    cold = load(d / "cold_start.json")
    if cold:
        print("\n== cold start (cold_start.json); target: first <= 2x steady median")
        print(table(cold, [("kind", "kind", ""), ("first_ms", "first ms", ".1f"),
                           ("steady_median_ms", "steady ms", ".1f"), ("ratio", "ratio", ".2f"),
                           ("ready_s", "ready s", ".1f")]))
    offline = load(d / "sharegpt_offline.json")
    if offline:
        print("\n== ShareGPT offline (sharegpt_offline.json); target: default >= 20,000 out tok/s")
        print(table(offline, [("config", "config", ""), ("requests", "requests", "d"),
                              ("output_tok_s", "out tok/s", ".0f"), ("total_tok_s", "total tok/s", ".0f"),
                              ("max_num_seqs", "max seqs", "d"), ("kv_dtype", "kv", "")]))
    e2e = {r.get("config"): r for r in load(d / "e2e.json") if r.get("workload") == "few-shot"}
    if "default" in e2e:
        on, off = e2e["default"], e2e.get("cache-off-bf16")
        x = on["output_tokens_per_s"] / off["output_tokens_per_s"] if off else None
        print(f"\n== few-shot (e2e.json): default {on['output_tokens_per_s']:.1f} out tok/s"
              + (f", cache-off {off['output_tokens_per_s']:.1f} -> {x:.1f}x (target >= 10x)" if x else ""))
    if not (load_rows or cold or offline or e2e):
        print(f"no result JSONs in {d}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
