"""Whole `radixkv replay` commands timed from outside, alternating in one invocation (issue 20).

Each case is a full command line run as a fresh process (start-up, imports, parsing, the replay,
the summary), the cases alternating round by round (the order rotates) so the machine's load falls
on all alike. Per run: wall seconds, CPU seconds of the child (user + sys, from wait4), peak RSS,
the 1-minute load average before it and the CPU other processes used meanwhile (cores: busy
jiffies of /proc/stat minus the child's CPU, over wall time). Summary: median and min-max.

    python benchmarks/cache/bench_replay_cmd.py [--runs 5] [--cases seq seq-cap weka-fcfs weka-lpm]
                                                [--traces ../shared/traces] [--json OUT.json]
                                                [--bytecode-cache] [--compare-with DIR]

--compare-with DIR runs each case also on another radixkv (say an older commit, `git archive`d
and laid out as an installed package under DIR), alternating with this one, as CASE@old.

Cases (TRACE = the Mooncake synthetic trace, WEKA = the folder of WEKA conversations):
  seq        radixkv replay TRACE --sequential
  seq-cap    radixkv replay TRACE --sequential --num-pages 187500          (3M tokens, LRU)
  weka-fcfs  radixkv replay WEKA --simulate --page-size 64 --num-pages 2000 --policy fcfs
  weka-lpm   the same with --policy lpm                        (the target: <= 1.5x weka-fcfs)
`radixkv` is the console script next to this Python (its pyenv shim adds ~0.1 s when run as
`radixkv` from a shell; the figures here exclude it). `--bytecode-cache`: Python's default module
cache on (this environment sets PYTHONDONTWRITEBYTECODE=1, so radixkv's sources compile each run).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TRACES = ROOT.parent / "shared" / "traces"


def cases(traces: Path) -> dict[str, list[str]]:
    trace = str(traces / "mooncake" / "synthetic_trace.jsonl")
    if not Path(trace).exists():  # the same file, bundled with the package
        trace = "mooncake-synthetic"
    weka = str(traces / "weka_claude_code")
    sim = ["--simulate", "--page-size", "64", "--num-pages", "2000"]
    return {"seq": ["replay", trace, "--sequential"],
            "seq-cap": ["replay", trace, "--sequential", "--num-pages", "187500"],
            "weka-fcfs": ["replay", weka, *sim, "--policy", "fcfs"],
            "weka-lpm": ["replay", weka, *sim, "--policy", "lpm"]}


def _busy_jiffies() -> int:
    with open("/proc/stat") as f:
        vals = [int(v) for v in f.readline().split()[1:]]
    return sum(vals) - vals[3] - vals[4]


def radixkv_command() -> list[str]:
    here = Path(sys.executable).with_name("radixkv")
    if here.exists():
        return [str(here)]
    found = shutil.which("radixkv")
    return [found] if found else [sys.executable, "-m", "radixkv.cli"]


def run_once(argv: list[str], pycache: str | None = None, pythonpath: str | None = None,
             cwd: str | None = None) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    if pycache is not None:  # Python's default: compiled modules cached (here in a private folder)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = pycache
    load = os.getloadavg()[0]
    busy0 = _busy_jiffies()
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True, cwd=cwd)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    out = proc.stdout.read()
    err = proc.stderr.read()
    proc.stdout.close()
    proc.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{err}")
    cpu = usage.ru_utime + usage.ru_stime
    other = max((_busy_jiffies() - busy0) / os.sysconf("SC_CLK_TCK") - cpu, 0.0) / wall
    hit = re.search(r"prefix hit rate\s+([0-9.]+)", out)
    replay = re.search(r"replay wall time\s+([0-9.]+) s", out)
    return {"wall_s": wall, "cpu_s": cpu, "max_rss_mb": usage.ru_maxrss / 1024, "load_1m_before": load,
            "other_cpu_cores": other, "hit_rate": float(hit.group(1)) if hit else None,
            "replay_wall_s": float(replay.group(1)) if replay else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--cases", nargs="+", default=None, help="default: all")
    ap.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--bytecode-cache", action="store_true",
                    help="let Python cache compiled modules (its default; PYTHONDONTWRITEBYTECODE=1 "
                         "otherwise recompiles radixkv's sources on every run), in a temporary folder")
    ap.add_argument("--python-m", action="store_true", help="run `python -m radixkv.cli` (no console script)")
    ap.add_argument("--compare-with", metavar="DIR", default=None,
                    help="also run every case on the radixkv package found in DIR (PYTHONPATH=DIR, e.g. an older "
                         "commit unpacked there), as CASE@old, alternating; both then run `python -m radixkv.cli` "
                         "from a scratch folder")
    args = ap.parse_args()
    table = cases(args.traces)
    names = args.cases or list(table)
    unknown = set(names) - set(table)
    if unknown:
        raise SystemExit(f"unknown cases {sorted(unknown)}; known: {list(table)}")
    compare = args.compare_with is not None
    cmd = [sys.executable, "-m", "radixkv.cli"] if args.python_m or compare else radixkv_command()
    cwd = tempfile.mkdtemp(prefix="radixkv-cwd-") if compare else None
    variants = [(name, None) for name in names]
    if compare:
        variants = [v for name in names for v in ((name, None), (name + "@old", args.compare_with))]
        table.update({name + "@old": table[name] for name in names})
        names = [v[0] for v in variants]
    paths = dict(variants)
    pycache = tempfile.mkdtemp(prefix="radixkv-pyc-") if args.bytecode_cache else None
    if pycache is not None:
        run_once(cmd + table[names[0]], pycache, paths[names[0]], cwd)  # warm-up: writes the cache
    started = datetime.now(timezone.utc)
    runs: list[dict] = []
    for i in range(args.runs):
        order = names[i % len(names):] + names[: i % len(names)]
        for name in order:
            res = run_once(cmd + table[name], pycache, paths[name], cwd)
            res.update(case=name, round=i + 1)
            runs.append(res)
            print(f"# {i + 1}/{args.runs} {name:<10} wall {res['wall_s']:.3f} s cpu {res['cpu_s']:.3f} s "
                  f"replay {res['replay_wall_s']} s hit {res['hit_rate']} load {res['load_1m_before']:.2f} "
                  f"other {res['other_cpu_cores']:.2f}", flush=True)
    summary = []
    print(f"{'case':<10} {'wall s':>7} {'min-max':>13} {'cpu s':>7} {'replay s':>8} {'RSS MB':>7} {'hit':>7}  load / other")
    for name in names:
        rs = [r for r in runs if r["case"] == name]
        e = {"case": name, "command": " ".join(["radixkv", *table[name]]), "runs": len(rs),
             "median_wall_s": statistics.median(r["wall_s"] for r in rs), "min_wall_s": min(r["wall_s"] for r in rs),
             "max_wall_s": max(r["wall_s"] for r in rs), "median_cpu_s": statistics.median(r["cpu_s"] for r in rs),
             "median_replay_wall_s": statistics.median(r["replay_wall_s"] or 0.0 for r in rs),
             "max_rss_mb": max(r["max_rss_mb"] for r in rs), "hit_rate": rs[0]["hit_rate"],
             "load_1m": [round(r["load_1m_before"], 2) for r in rs],
             "other_cpu_cores": [round(r["other_cpu_cores"], 2) for r in rs]}
        summary.append(e)
        print(f"{name:<10} {e['median_wall_s']:>7.3f} {e['min_wall_s']:>6.3f}-{e['max_wall_s']:<6.3f} "
              f"{e['median_cpu_s']:>7.3f} {e['median_replay_wall_s']:>8.3f} {e['max_rss_mb']:>7.0f} "
              f"{e['hit_rate']!s:>7}  {e['load_1m']} / {e['other_cpu_cores']}")
    by = {e["case"]: e for e in summary}
    for tag in ("", "@old"):
        if "weka-lpm" + tag in by and "weka-fcfs" + tag in by:
            lpm, fcfs = by["weka-lpm" + tag], by["weka-fcfs" + tag]
            print(f"weka lpm / fcfs{tag}: wall {lpm['median_wall_s'] / fcfs['median_wall_s']:.2f}, "
                  f"cpu {lpm['median_cpu_s'] / fcfs['median_cpu_s']:.2f} (target <= 1.5)")
    if args.json:
        args.json.write_text(json.dumps({"command": " ".join([Path(sys.executable).name, *sys.argv]),
                                         "started_utc": started.isoformat(), "radixkv": cmd, "cpus": os.cpu_count(),
                                         "bytecode_cache": pycache is not None, "compare_with": args.compare_with,
                                         "summary": summary, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
