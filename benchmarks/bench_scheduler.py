"""Compare the scheduler's policies in simulation: prefix hit rate, queueing delay, preemptions.

No model and no GPU: radixkv.simulator replays each workload through Scheduler + RadixCache
with the default CostModel (Llama-3-8B on an H200, see radixkv/cost_model.py) as the clock.

Workloads (data from ../shared/traces, see its README):
- mooncake: the Mooncake synthetic trace (3,993 requests, 61M prompt tokens), arrivals at
  their timestamps and as a burst, into a 3M-token pool (the local cache size of the Mooncake
  paper's Figure 9).
- few-shot: GSM8K 8-shot prompts over 12 templates (each its own 8 train examples, ~2.5k
  byte tokens), 1,200 test questions spread over the templates, Poisson arrivals at 40/s,
  into a pool that holds about 4 templates.
- multi-turn: ShareGPT conversations; turn k resends the whole history (byte tokens). One
  conversation starts every 0.2 s, its turns 10 s apart; the pool holds 80k tokens.
Each runs with fcfs, lpm, dfs-weight (default starvation guard: 10 s / 200 steps) and lpm
without the guard, at concurrency 64.

    python benchmarks/bench_scheduler.py [--quick] [--jobs N] [--json OUT.json]

--quick cuts every workload to a few hundred requests (a smoke run, ~1 minute).
"""
from __future__ import annotations

import argparse
import json
import random
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import NamedTuple

from radixkv import Policy, SchedulerConfig
from radixkv.cost_model import CostModel
from radixkv.request import Request
from radixkv.simulator import simulate
from radixkv.workloads.traces import byte_tokenize, load_trace

DEFAULT_TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
PAGE_SIZE = 16
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
    reqs = [Request(i, t.tokens(), t.max_tokens, arrival_s=t.arrival_s)
            for i, t in enumerate(trace.requests[:limit])]
    pages = 3_000_000 // PAGE_SIZE
    return [Workload("mooncake", reqs, pages, False), Workload("mooncake burst", reqs, pages, True)]


def few_shot(traces: Path, limit: int | None, seed: int = 0) -> list[Workload]:
    rng = random.Random(seed)
    load = lambda name: [json.loads(x) for x in (traces / "gsm8k" / name).read_text().splitlines()]
    train, test = load("train.jsonl"), load("test.jsonl")[: limit or 1200]
    rng.shuffle(train)
    shots = 8
    templates = ["".join(f"Question: {e['question']}\nAnswer: {e['answer']}\n\n"
                         for e in train[t * shots: (t + 1) * shots]) for t in range(12)]
    reqs, now = [], 0.0
    for i, q in enumerate(test):
        now += rng.expovariate(40.0)
        prompt = templates[rng.randrange(len(templates))] + f"Question: {q['question']}\nAnswer:"
        reqs.append(Request(i, byte_tokenize(prompt), 96, arrival_s=now))
    template_pages = max(len(t.encode()) for t in templates) // PAGE_SIZE
    pages = 4 * template_pages + CONCURRENCY * 24
    return [Workload("few-shot", reqs, pages, False), Workload("few-shot burst", reqs, pages, True)]


def multi_turn(traces: Path, limit: int | None) -> list[Workload]:
    path = traces / "sharegpt" / "sharegpt_v3_multiturn_first2000.jsonl"
    reqs: list[Request] = []
    conv = 0
    for line in path.read_text().splitlines():
        turns = json.loads(line)["conversations"]
        if len(turns) < 4 or sum(len(t["value"]) for t in turns) > 24_000:
            continue
        history = ""
        for k in range(0, len(turns) - 1, 2):
            if turns[k]["from"] != "human" or turns[k + 1]["from"] != "gpt":
                break
            history += f"User: {turns[k]['value']}\n"
            reqs.append(Request(len(reqs), byte_tokenize(history + "Assistant:"),
                                min(256, max(1, len(turns[k + 1]["value"]))),
                                arrival_s=0.2 * conv + 10.0 * (k // 2)))
            history += f"Assistant: {turns[k + 1]['value']}\n"
        conv += 1
        if len(reqs) >= (limit or 2000):
            break
    pages = 80_000 // PAGE_SIZE
    return [Workload("multi-turn", reqs, pages, False), Workload("multi-turn burst", reqs, pages, True)]


def run_one(job: tuple[Workload, Variant]) -> dict:
    w, v = job
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
    loads = [w for make in (mooncake, few_shot, multi_turn) for w in make(a.traces, limit)
             if a.only is None or w.name.startswith(a.only)]
    jobs = [(w, v) for w in loads for v in variants()]
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
