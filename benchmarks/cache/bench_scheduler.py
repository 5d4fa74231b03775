"""Compare the scheduler's policies in simulation: prefix hit rate, queueing delay, preemptions.

No model and no GPU: radixkv.replay.simulator replays each workload through Scheduler + RadixCache
with the default CostModel (Llama-3-8B on an H200, see radixkv/cost_model.py) as the clock.

Workloads (data from ../shared/traces, see its README):
- mooncake: the Mooncake synthetic trace (3,993 requests, 61M prompt tokens), arrivals at
  their timestamps and as a burst, into a 3M-token pool (the local cache size of the Mooncake
  paper's Figure 9).
- few-shot (radixkv.workloads.few_shot): GSM8K 8-shot prompts over 12 templates (~2.5k byte
  tokens each), 1,200 test questions spread over the templates, Poisson arrivals at 40/s,
  into a pool that holds about 4 templates next to the running requests.
- multi-turn (radixkv.workloads.multi_turn): 400 sessions with ShareGPT turn lengths (up to 6
  turns, replies capped at 256 tokens); turn k resends the whole history. Sessions start at
  12/s, think time 10 s (mean); the pool holds 80k tokens.
Each runs with fcfs, lpm, dfs-weight (default starvation guard: 10 s / 200 steps) and lpm
without the guard, at concurrency 64.

    python benchmarks/cache/bench_scheduler.py [--quick] [--jobs N] [--json OUT.json]

--quick cuts every workload to a few hundred requests (a smoke run, ~1 minute).
"""
from __future__ import annotations

import argparse
import functools
import json
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import NamedTuple

from radixkv import Policy, SchedulerConfig
from radixkv.replay.cost_model import CostModel
from radixkv.request import Request
from radixkv.replay.simulator import simulate
from radixkv.workloads.few_shot import FewShotConfig
from radixkv.workloads.few_shot import few_shot as gen_few_shot
from radixkv.workloads.multi_turn import MultiTurnConfig
from radixkv.workloads.multi_turn import multi_turn as gen_multi_turn
from radixkv.workloads.trace_loading import load_trace

DEFAULT_TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "traces"
PAGE_SIZE = 16
WORKLOADS = ("mooncake", "mooncake burst", "few-shot", "few-shot burst", "multi-turn", "multi-turn burst")
CONCURRENCY = 64


class Workload(NamedTuple):
    name: str
    requests: list[Request]
    num_pages: int
    burst: bool


class Variant(NamedTuple):
    label: str
    config: SchedulerConfig


def variants() -> list[Variant]:
    out = [Variant(p.value, SchedulerConfig(policy=p, max_running=CONCURRENCY)) for p in Policy]
    out.append(Variant("lpm, no guard", SchedulerConfig(policy=Policy.LPM, max_running=CONCURRENCY,
                                                        starvation_steps=None, starvation_s=None)))
    return out


def mooncake(traces: Path, limit: int | None) -> list[Workload]:
    trace = load_trace(traces / "mooncake" / "synthetic_trace.jsonl")
    reqs = _requests(trace.requests[:limit])
    pages = 3_000_000 // PAGE_SIZE
    return [Workload("mooncake", reqs, pages, False), Workload("mooncake burst", reqs, pages, True)]


def _requests(trace: list) -> list[Request]:
    return [Request(i, t.tokens(), t.max_tokens, arrival_s=t.arrival_s) for i, t in enumerate(trace)]


def few_shot(traces: Path, limit: int | None) -> list[Workload]:
    per_template = (limit or 1200) // 12
    reqs = _requests(gen_few_shot(FewShotConfig(templates=12, shots=8, prompts_per_template=per_template,
                                                max_tokens=96, rate=40.0), traces / "gsm8k"))
    template_pages = max(len(r.prompt) for r in reqs) // PAGE_SIZE
    pages = 4 * template_pages + CONCURRENCY * 24
    return [Workload("few-shot", reqs, pages, False), Workload("few-shot burst", reqs, pages, True)]


def multi_turn(traces: Path, limit: int | None) -> list[Workload]:
    cfg = MultiTurnConfig(sessions=(limit or 2000) // 5, max_turns=6, system_len=256, max_reply=256,
                          rate=12.0, think_s=10.0)
    reqs = _requests(gen_multi_turn(cfg, traces / "sharegpt" / "sharegpt_v3_multiturn_first2000.jsonl"))
    pages = 80_000 // PAGE_SIZE
    return [Workload("multi-turn", reqs, pages, False), Workload("multi-turn burst", reqs, pages, True)]


class Job(NamedTuple):
    """One simulation; workers rebuild the workload from its name (no big pickles)."""

    workload: str
    variant: str
    traces: Path
    limit: int | None


@functools.lru_cache(maxsize=None)
def workloads(traces: Path, limit: int | None) -> dict[str, Workload]:
    return {w.name: w for make in (mooncake, few_shot, multi_turn) for w in make(traces, limit)}


def run_one(job: Job) -> dict:
    w = workloads(job.traces, job.limit)[job.workload]
    v = next(v for v in variants() if v.label == job.variant)
    t0 = time.perf_counter()
    r = simulate(w.requests, w.num_pages, PAGE_SIZE, v.config, CostModel(), burst=w.burst)
    row = {"workload": w.name, "policy": v.label, "num_pages": w.num_pages, **r.as_json(),
           "wall_s": time.perf_counter() - t0}
    print(f"  {w.name:<17} {v.label:<14} hit {r.hit_rate:6.1%}  wait p99 {r.wait_p99_s:8.2f}s "
          f"max {r.wait_max_s:8.2f}s  preempt {r.preemptions:5d}  wall {row['wall_s']:.1f}s", flush=True)
    return row


def table(rows: list[dict]) -> str:
    head = ("| workload | policy | requests | pages | hit rate | wait p50 s | wait p99 s | wait max s "
            "| preemptions | leaked | sim s | wall s |\n|" + " --- |" * 12)
    lines = [head]
    for r in rows:
        lines.append(f"| {r['workload']} | {r['policy']} | {r['completed']}/{r['requests']} | "
                     f"{r['num_pages']} | {r['hit_rate']:.1%} | {r['wait_p50_s']:.2f} | "
                     f"{r['wait_p99_s']:.2f} | {r['wait_max_s']:.2f} | {r['preemptions']} | "
                     f"{r['leaked_pages']} | {r['sim_seconds']:.0f} | {r['wall_s']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a few hundred requests per workload")
    ap.add_argument("--jobs", type=int, default=1, help="simulations run in parallel processes")
    ap.add_argument("--only", default=None, help="run workloads whose name starts with this")
    ap.add_argument("--traces", type=Path, default=DEFAULT_TRACES, help="the shared traces folder")
    ap.add_argument("--json", type=Path, default=None, help="write every row here")
    a = ap.parse_args()
    limit = 300 if a.quick else None
    names = [n for n in WORKLOADS if a.only is None or n.startswith(a.only)]
    jobs = [Job(n, v.label, a.traces, limit) for n in names for v in variants()]
    if a.jobs > 1:
        with ProcessPoolExecutor(a.jobs) as ex:
            rows = list(ex.map(run_one, jobs))
    else:
        rows = [run_one(j) for j in jobs]
    print(table(rows))
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
