"""Sequential Mooncake replay through PagePool + RadixCache (page size 16).

For each request, in file order: expand its hash ids to tokens (not timed), match, count
hit tokens, lock the match, evict LRU pages if the pool is short (capped pool only),
allocate pages for the missing full blocks, insert, unlock, release the request's own
references. Only the tree operations (match, lock, evict, insert, unlock) are timed, with
time.perf_counter; parsing, token expansion, the pool's alloc/decref and building the
caller's page list (`m.pages + new_pages`) are not. After each replay the tree is cleared
and the pool must be whole again (a leak check).

Each pool configuration runs in its own child process so that its peak RSS is its own;
the child replays the trace `--repeats` times (a fresh pool and tree each time) and
reports the median tree time.

    python benchmarks/cache/bench_tree.py [--trace PATH] [--repeats 3] [--config unlimited capped]
                                    [--clock wall|cpu]
"""
from __future__ import annotations

import argparse
import enum
import json
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np

from radixkv.cache.pages import PagePool
from radixkv.cache.radix_tree import RadixCache
from radixkv.workloads.traces import MOONCAKE_BLOCK_TOKENS, expand_hash_ids, read_mooncake

DEFAULT_TRACE = Path("../shared/traces/mooncake/synthetic_trace.jsonl")
PAGE_SIZE = 16
CAPPED_TOKENS = 3_000_000


class PoolConfig(enum.Enum):
    UNLIMITED = "unlimited"  # a pool as large as every full block of the trace
    CAPPED = "capped"  # 3,000,000 tokens; LRU eviction before inserting


class Clock(enum.Enum):
    WALL = "wall"  # time.perf_counter: what a user waits (includes time other processes take)
    CPU = "cpu"  # time.process_time: this process's CPU time (steadier on a shared machine)

    def fn(self) -> Callable[[], float]:
        return time.perf_counter if self is Clock.WALL else time.process_time


class ReplayResult(NamedTuple):
    prompt_tokens: int
    hit_tokens: int
    tree_seconds: float
    evicted_pages: int


class ConfigResult(NamedTuple):
    config: str
    pool_pages: int
    requests: int
    prompt_tokens: int
    hit_rate: float
    tree_seconds: list[float]  # one per repeat
    median_seconds: float
    tokens_per_s: float
    evicted_pages: int
    peak_rss_mb: float


def _hashed_prompts(trace_path: Path) -> list[tuple[np.ndarray, int]]:
    trace = read_mooncake(trace_path)
    return [(r.prompt.hash_ids, r.prompt.input_length) for r in trace.requests]


def replay(prompts: list[tuple[np.ndarray, int]], num_pages: int, clock: Clock = Clock.WALL) -> ReplayResult:
    """One sequential pass over the trace with a fresh pool and tree."""
    pool = PagePool(num_pages)
    cache = RadixCache(pool, page_size=PAGE_SIZE)
    now = clock.fn()
    tree_s = 0.0
    prompt_tokens = hit_tokens = evicted = 0
    for hash_ids, input_length in prompts:
        tokens = expand_hash_ids(hash_ids, input_length, MOONCAKE_BLOCK_TOKENS)  # int32 [L]
        tokens.flags.writeable = False  # lets the tree keep a view instead of a copy
        num_blocks = len(tokens) // PAGE_SIZE
        prompt_tokens += len(tokens)

        t0 = now()
        m = cache.match(tokens)
        need = num_blocks - m.num_tokens // PAGE_SIZE
        short = need - pool.num_free
        if short > 0:
            cache.lock(m)
            evicted += cache.evict(short)
            cache.unlock(m)
        tree_s += now() - t0

        hit_tokens += m.num_tokens
        if need > pool.num_free:
            continue  # the request alone is larger than the pool: nothing to cache
        new_pages = pool.alloc(need)
        pages = m.pages + new_pages  # the caller's page table (not a tree operation)

        t0 = now()
        cache.insert(tokens, pages)
        tree_s += now() - t0

        pool.decref(new_pages)  # the request finishes: the tree keeps its own references
    cache.clear()  # also breaks the nodes' parent <-> child cycles, so the next repeat starts lean
    if pool.num_free != pool.num_pages:
        raise AssertionError(f"leak: {pool.num_pages - pool.num_free} pages still held after clear()")
    return ReplayResult(prompt_tokens, hit_tokens, tree_s, evicted)


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def run_config(trace_path: Path, config: PoolConfig, repeats: int, clock: Clock) -> ConfigResult:
    prompts = _hashed_prompts(trace_path)
    if config is PoolConfig.UNLIMITED:
        num_pages = sum(length // PAGE_SIZE for _, length in prompts)
    else:
        num_pages = CAPPED_TOKENS // PAGE_SIZE
    runs = [replay(prompts, num_pages, clock) for _ in range(repeats)]
    times = [r.tree_seconds for r in runs]
    median = statistics.median(times)
    first = runs[0]
    return ConfigResult(config.value, num_pages, len(prompts), first.prompt_tokens,
                        first.hit_tokens / first.prompt_tokens, times, median,
                        first.prompt_tokens / median, first.evicted_pages, _peak_rss_mb())


def _run_in_child(trace_path: Path, config: PoolConfig, repeats: int, clock: Clock) -> ConfigResult:
    cmd = [sys.executable, __file__, "--trace", str(trace_path), "--repeats", str(repeats),
           "--clock", clock.value, "--child", config.value]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return ConfigResult(**json.loads(out.strip().splitlines()[-1]))


def print_table(results: list[ConfigResult]) -> None:
    print(f"{'pool':<10} {'pages':>9} {'hit rate':>9} {'tree s (median)':>16} "
          f"{'runs s':>22} {'tokens/s':>12} {'evicted':>9} {'peak RSS MB':>12}")
    for r in results:
        runs = "/".join(f"{t:.3f}" for t in r.tree_seconds)
        print(f"{r.config:<10} {r.pool_pages:>9} {r.hit_rate:>9.4f} {r.median_seconds:>16.3f} "
              f"{runs:>22} {r.tokens_per_s:>12.3e} {r.evicted_pages:>9} {r.peak_rss_mb:>12.0f}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE,
                    help="Mooncake JSONL trace (default: %(default)s, relative to the repo root)")
    ap.add_argument("--repeats", type=int, default=3, help="replays per configuration (median reported)")
    ap.add_argument("--config", nargs="+", choices=[c.value for c in PoolConfig],
                    default=[c.value for c in PoolConfig])
    ap.add_argument("--clock", choices=[c.value for c in Clock], default=Clock.WALL.value,
                    help="wall: time.perf_counter (default); cpu: time.process_time")
    ap.add_argument("--child", choices=[c.value for c in PoolConfig], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if not args.trace.is_file():
        raise SystemExit(f"trace not found: {args.trace} (run from the repo root or pass --trace)")
    if args.repeats < 1:
        raise SystemExit(f"--repeats must be >= 1, got {args.repeats}")
    if args.child:
        result = run_config(args.trace, PoolConfig(args.child), args.repeats, Clock(args.clock))
        print(json.dumps(result._asdict()))
        return
    clock = Clock(args.clock)
    results = [_run_in_child(args.trace, PoolConfig(c), args.repeats, clock) for c in args.config]
    print(f"trace {args.trace}: {results[0].requests} requests, {results[0].prompt_tokens} prompt "
          f"tokens, page size {PAGE_SIZE}, median of {args.repeats}, {clock.value} clock")
    print_table(results)


if __name__ == "__main__":
    main()
