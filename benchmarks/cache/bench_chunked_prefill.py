"""Chunked prefill of one long prompt through the scheduler: seconds of control-plane work by length.

    python benchmarks/cache/bench_chunked_prefill.py 1e6 4e6 1e7

Each chunk (max_batch_tokens = 8192) caches its blocks below the locked path (RadixCache.extend),
so the time grows linearly with the prompt; before that it was quadratic (42 s for 10M tokens in
a simulated replay). Page 16, FCFS, one request, one output token; no model.
"""
from __future__ import annotations

import sys
import time

import numpy as np

from radixkv.cache import PagePool, RadixCache
from radixkv.config import SchedulerConfig
from radixkv.request import Request
from radixkv.scheduler import Scheduler


def run(n: int, ps: int = 16) -> tuple[int, float]:
    pool = PagePool(n // ps + 2)
    cache = RadixCache(pool, ps)
    s = Scheduler(pool, cache, SchedulerConfig(), ps)
    s.add(Request(0, np.arange(n, dtype=np.int64) % 30000, max_tokens=1), 0.0)
    t, steps = time.perf_counter(), 0
    while s.has_work():
        b = s.schedule(0.0)
        steps += 1
        s.update(b, [7 if x else None for x in b.sample], 0.0)
    dt = time.perf_counter() - t
    cache.check_invariants()
    return steps, dt


def main(argv: list[str]) -> int:
    print(f"{'tokens':>12} {'steps':>6} {'seconds':>8} {'ns/token':>9}")
    for arg in argv or ["1e5", "1e6", "4e6"]:
        n = int(float(arg))
        steps, dt = run(n)
        print(f"{n:>12,} {steps:>6} {dt:>8.3f} {dt / n * 1e9:>9.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
