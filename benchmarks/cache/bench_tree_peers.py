"""radixkv's tree against the peers' own radix caches, side by side in one invocation.

The same sequential replay (page 16, file order) of the bundled Mooncake synthetic trace
(`bundled_trace('mooncake-synthetic')`, 3,993 requests, 61M prompt tokens) and of the WEKA coding-agent
conversations (`../shared/traces/weka_claude_code`, 11 files, 572 requests, 77M prompt tokens, 96% reuse;
`--traces weka`; another folder in $RADIXKV_WEKA_TRACES) runs through

  radixkv/list   radixkv's `_SequentialServer` (radixkv/replay/replay.py) fed a Python list per request
  radixkv/int32  the same fed the int32 array `TraceRequest.tokens()` returns
  mini-sglang    `minisgl.kvcache.radix_cache.RadixPrefixCache` fed an int32 CPU torch tensor
  sglang         `sglang.srt.mem_cache.radix_cache.RadixCache` fed a `RadixKey` over array('q')

for two pools: unlimited (nothing is ever evicted) and a cap (LRU eviction before allocating):
3,000,000 tokens for Mooncake (187,500 pages), 1,000,000 for WEKA (62,500 pages; its largest
request is 623k tokens). Each request, in every row: match, lock, evict if the pool is short,
allocate the uncached pages (tail page included), insert the prompt's full blocks, unlock, free the
request's own pages; a request larger than the whole pool is skipped (counted, no insert). The peers
get a minimal page allocator written here (a free stack of pages handing out page*16+i token slots,
which is what their trees store); radixkv uses its PagePool.

Timed: only those per-request operations (time.perf_counter around each request, summed). Not timed:
reading the trace, expanding hash ids, building each row's native token container (list, array,
tensor, RadixKey). Every run is a fresh process (`--child`) with OMP_NUM_THREADS=1; runs alternate
row by row (the row order rotates each round) so the machine's load falls on all rows alike. Beside
each run: the 1-minute load average before it, and the CPU other processes used during it (cores:
busy jiffies of /proc/stat over the timed region minus this process's own CPU time, over wall time).
Memory: peak RSS growth of the child over the replay (ru_maxrss after minus RSS before, pool built).

    python benchmarks/cache/setup_peers.py          # once: peers into benchmarks/cache/peers/
    python benchmarks/cache/bench_tree_peers.py [--runs 3] [--traces mooncake weka] [--pools unlimited cap]
                                                [--rows ...] [--json benchmarks/results/tree_peers.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
PEERS = HERE / "peers"
WEKA = Path(os.environ.get("RADIXKV_WEKA_TRACES", HERE.parents[1].parent / "shared" / "traces" / "weka_claude_code"))
PAGE_SIZE = 16
CAP_TOKENS = {"mooncake": 3_000_000, "weka": 1_000_000}
TRACES = list(CAP_TOKENS)
ROWS = ["radixkv/list", "radixkv/int32", "mini-sglang", "sglang"]
POOLS = ["unlimited", "cap"]


# ---- measurements inside one child process --------------------------------------------------
def _busy_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs from /proc/stat."""
    with open("/proc/stat") as f:
        vals = [int(v) for v in f.readline().split()[1:]]
    idle = vals[3] + vals[4]
    return sum(vals) - idle, sum(vals)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _PeerPages:
    """A page allocator for the peers: a free stack of page ids; a page holds token slots
    page*ps .. page*ps+ps-1, the per-token indices the peers' trees store."""

    def __init__(self, torch, num_pages: int, ps: int, dtype) -> None:
        self.torch, self.ps, self.dtype = torch, ps, dtype
        self.free = torch.arange(num_pages - 1, -1, -1, dtype=dtype)  # in the tree's index dtype
        self.top = num_pages
        self.offsets = torch.arange(ps, dtype=dtype)

    @property
    def num_free(self) -> int:
        return self.top

    def alloc(self, n: int):
        pages = self.free[self.top - n: self.top].flip(0)
        self.top -= n
        return (pages[:, None] * self.ps + self.offsets).reshape(-1)

    def free_slots(self, slots) -> None:
        if len(slots) == 0:
            return
        pages = slots[:: self.ps] // self.ps
        n = len(pages)
        self.free[self.top: self.top + n] = pages.flip(0)
        self.top += n

    def free_segment(self, slots, start_pos: int = 0) -> None:  # SGLang's allocator call
        self.free_slots(slots)


def _requests(trace: str = "mooncake"):
    from radixkv.workloads.trace_loading import read_weka
    from radixkv.workloads.traces import read_mooncake

    if trace == "weka":
        return read_weka(WEKA).requests
    from radixkv.workloads.data import bundled_trace

    return read_mooncake(bundled_trace("mooncake-synthetic")).requests


def _num_pages(requests, pool: str, trace: str = "mooncake") -> int:
    if pool == "cap":
        return CAP_TOKENS[trace] // PAGE_SIZE
    return sum(-(-r.num_prompt_tokens // PAGE_SIZE) for r in requests) + 1


def _run_radixkv(requests, num_pages: int, container: str):
    from radixkv.replay.replay import _SequentialServer

    server = _SequentialServer(num_pages, PAGE_SIZE)
    evicts = _count_calls(server.cache, "evict")

    def prepare(r):
        t = r.tokens()
        return t.tolist() if container == "list" else t

    def serve(tokens):
        hit, ran, _ = server.serve(tokens)
        return hit, ran

    return prepare, serve, evicts, server.cache


def _count_calls(obj, name: str) -> list[int]:
    count = [0]
    fn = getattr(obj, name)

    def counted(*a, **k):
        count[0] += 1
        return fn(*a, **k)

    setattr(obj, name, counted)
    return count


def _run_minisgl(requests, num_pages: int):
    sys.path[:0] = [str(PEERS / "site"), str(PEERS / "minisgl")]
    import torch
    from minisgl.kvcache.radix_cache import RadixPrefixCache

    torch.set_num_threads(1)
    ps = PAGE_SIZE
    cache = RadixPrefixCache(torch.device("cpu"))
    alloc = _PeerPages(torch, num_pages, ps, torch.int32)
    evicts = _count_calls(cache, "evict")
    empty = torch.empty(0, dtype=torch.int32)

    def prepare(r):
        return torch.from_numpy(r.tokens())  # int32 CPU tensor: what mini-sglang's scheduler holds

    def serve(ids):
        n = len(ids)
        handle = cache.match_prefix(ids).cuda_handle
        hit = handle.cached_len
        cache.lock_handle(handle)
        need = -(-n // ps) - hit // ps
        if need > alloc.num_free + cache.evictable_size // ps:
            cache.lock_handle(handle, unlock=True)
            return hit, False
        if need > alloc.num_free:
            alloc.free_slots(cache.evict((need - alloc.num_free) * ps))
        new = alloc.alloc(need)
        full = n // ps * ps
        prefix = handle.get_matched_indices() if hit else empty
        value = torch.cat([prefix, new[: full - hit]])
        res = cache.insert_prefix(ids[:full], value)
        alloc.free_slots(value[hit: res.cached_len])  # duplicates (none: the match is locked)
        alloc.free_slots(new[full - hit:])  # the partial tail page
        cache.lock_handle(handle, unlock=True)
        return hit, True

    return prepare, serve, evicts, cache


def _run_sglang(requests, num_pages: int):
    sys.path[:0] = [str(PEERS / "sglang")]
    from array import array

    import torch
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey

    torch.set_num_threads(1)
    ps = PAGE_SIZE
    alloc = _PeerPages(torch, num_pages, ps, torch.int64)
    alloc.device = "cpu"
    cache = RadixCache.create_simulated(mock_allocator=alloc, page_size=ps)
    evicts = _count_calls(cache, "evict")

    def prepare(r):
        return RadixKey(array("q", r.tokens().astype("int64").tobytes()))  # what SGLang's Req holds

    def serve(key):
        n = len(key)
        m = cache.match_prefix(MatchPrefixParams(key=key))
        hit, node = m.device_prefix_len, m.last_device_node
        cache.inc_lock_ref(node)
        need = -(-n // ps) - hit // ps
        if need > alloc.num_free + cache.evictable_size() // ps:
            cache.dec_lock_ref(node)
            return hit, False
        if need > alloc.num_free:
            cache.evict(EvictParams(num_tokens=(need - alloc.num_free) * ps))
        new = alloc.alloc(need)
        full = n // ps * ps
        value = torch.cat([cache.path_device_indices(node), new[: full - hit]])
        res = cache.insert(InsertParams(key=key.page_aligned(ps), value=value))
        alloc.free_slots(value[hit: res.prefix_len])  # duplicates (none: the match is locked)
        alloc.free_slots(new[full - hit:])  # the partial tail page
        cache.dec_lock_ref(node)
        return hit, True

    return prepare, serve, evicts, cache


def child(row: str, pool: str, trace: str) -> dict:
    requests = _requests(trace)
    num_pages = _num_pages(requests, pool, trace)
    if row.startswith("radixkv/"):
        prepare, serve, evicts, _keep = _run_radixkv(requests, num_pages, row.split("/")[1])
    elif row == "mini-sglang":
        prepare, serve, evicts, _keep = _run_minisgl(requests, num_pages)
    elif row == "sglang":
        prepare, serve, evicts, _keep = _run_sglang(requests, num_pages)
    else:
        raise SystemExit(f"unknown row {row}")
    import gc

    gc.collect()
    rss0 = _rss_bytes()
    busy0, _ = _busy_jiffies()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    timed = timed_cpu = 0.0
    prompt = hits = rejected = 0
    clock, cpu_clock = time.perf_counter, time.process_time
    for r in requests:
        tokens = prepare(r)
        t, c = clock(), cpu_clock()
        hit, ran = serve(tokens)
        timed += clock() - t
        timed_cpu += cpu_clock() - c
        prompt += r.num_prompt_tokens
        hits += hit
        rejected += not ran
    wall = time.perf_counter() - wall0
    cpu = time.process_time() - cpu0
    busy1, _ = _busy_jiffies()
    hz = os.sysconf("SC_CLK_TCK")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"trace": trace, "row": row, "pool": pool, "num_pages": num_pages, "seconds": timed, "cpu_seconds": timed_cpu, "prompt_tokens": prompt,
            "hit_tokens": hits, "hit_rate": hits / prompt, "rejected": rejected, "evict_calls": evicts[0],
            "rss_growth_mb": max(peak - rss0, 0) / 2**20,
            "other_cpu_cores": max((busy1 - busy0) / hz - cpu, 0.0) / wall, "wall_s": wall}


# ---- the parent: alternate fresh child processes, summarise -----------------------------------
def _spawn(row: str, pool: str, trace: str) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    load = os.getloadavg()[0]
    out = subprocess.run([sys.executable, __file__, "--child", row, pool, trace], env=env, check=True,
                         capture_output=True, text=True).stdout
    res = json.loads(out.strip().splitlines()[-1])
    res["load_1m_before"] = load
    return res


def _available_rows(rows: list[str]) -> list[str]:
    ok = []
    for row in rows:
        need = {"mini-sglang": PEERS / "minisgl/minisgl/kvcache/radix_cache.py",
                "sglang": PEERS / "sglang/sglang/srt/mem_cache/radix_cache.py"}.get(row)
        if need is not None and not need.exists():
            print(f"# {row}: not set up ({need} missing; run benchmarks/cache/setup_peers.py), skipped")
            continue
        ok.append(row)
    return ok


def _peer_note() -> dict:
    note = {}
    for name, rel in (("sglang", "sglang/VERSION"), ("mini-sglang", "minisgl/VERSION"),
                      ("mini-sglang compare", "minisgl/COMPARE")):
        p = PEERS / rel
        if p.exists():
            note[name] = p.read_text().strip()
    return note


def summarise(runs: list[dict], rows: list[str], pools: list[str], traces: list[str] = TRACES) -> list[dict]:
    table = []
    for trace, pool in ((t, p) for t in traces for p in pools):
        best_peer = None
        group = []
        for row in rows:
            rs = [r for r in runs if r["row"] == row and r["pool"] == pool and r.get("trace", "mooncake") == trace]
            if not rs:
                continue
            secs = [r["seconds"] for r in rs]
            entry = {"trace": trace, "pool": pool, "row": row, "runs": len(rs), "median_s": statistics.median(secs),
                     "min_s": min(secs), "max_s": max(secs),
                     "median_cpu_s": statistics.median(r["cpu_seconds"] for r in rs), "hit_rate": rs[0]["hit_rate"],
                     "hit_rates_agree": len({r["hit_tokens"] for r in rs}) == 1,
                     "rss_growth_mb": statistics.median(r["rss_growth_mb"] for r in rs),
                     "evict_calls": rs[0]["evict_calls"], "rejected": rs[0]["rejected"],
                     "load_1m": [round(r["load_1m_before"], 2) for r in rs],
                     "other_cpu_cores": [round(r["other_cpu_cores"], 2) for r in rs]}
            table.append(entry)
            group.append(entry)
            if not row.startswith("radixkv") and (best_peer is None or entry["median_s"] < best_peer["median_s"]):
                best_peer = entry
        for e in group:
            if e["row"].startswith("radixkv") and best_peer is not None:
                e["vs_fastest_peer"] = e["median_s"] / best_peer["median_s"]
                e["cpu_vs_fastest_peer"] = e["median_cpu_s"] / best_peer["median_cpu_s"]
                e["fastest_peer"] = best_peer["row"]
                e["rss_vs_fastest_peer"] = e["rss_growth_mb"] / best_peer["rss_growth_mb"]
    return table


def print_table(table: list[dict]) -> None:
    print(f"{'trace':<9} {'pool':<10} {'row':<14} {'median s':>9} {'min-max s':>13} {'cpu s':>6} {'hit rate':>9} {'RSS MB':>8} "
          f"{'evicts':>7} {'/fastest':>8} {'cpu/f':>6}  load 1m / other cores per run")
    for e in table:
        ratio = f"{e['vs_fastest_peer']:.2f}" if "vs_fastest_peer" in e else ""
        cratio = f"{e['cpu_vs_fastest_peer']:.2f}" if "cpu_vs_fastest_peer" in e else ""
        print(f"{e['trace']:<9} {e['pool']:<10} {e['row']:<14} {e['median_s']:>9.3f} {e['min_s']:>6.3f}-{e['max_s']:<6.3f} "
              f"{e['median_cpu_s']:>6.3f} {e['hit_rate']:>9.4f} {e['rss_growth_mb']:>8.1f} {e['evict_calls']:>7} "
              f"{ratio:>8} {cratio:>6}  "
              f"{e['load_1m']} / {e['other_cpu_cores']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--traces", nargs="+", choices=TRACES, default=TRACES)
    ap.add_argument("--pools", nargs="+", choices=POOLS, default=POOLS)
    ap.add_argument("--rows", nargs="+", choices=ROWS, default=ROWS)
    ap.add_argument("--json", type=Path, default=None, help="write the runs and the table here")
    ap.add_argument("--child", nargs=3, metavar=("ROW", "POOL", "TRACE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return
    rows = _available_rows(args.rows)
    runs = []
    started = datetime.now(timezone.utc)
    for i in range(args.runs):
        order = rows[i % len(rows):] + rows[: i % len(rows)]  # rotate so no row always runs first
        for trace, pool in ((t, p) for t in args.traces for p in args.pools):
            for row in order:
                res = _spawn(row, pool, trace)
                runs.append(res)
                print(f"# run {i + 1}/{args.runs} {trace:<8} {pool:<9} {row:<14} {res['seconds']:.3f} s  "
                      f"hit {res['hit_rate']:.4f}  load {res['load_1m_before']:.2f}  "
                      f"other {res['other_cpu_cores']:.2f} cores", flush=True)
    table = summarise(runs, rows, args.pools, args.traces)
    print_table(table)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "command": " ".join([Path(sys.executable).name, *sys.argv]), "started_utc": started.isoformat(),
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
            "peers": _peer_note(), "page_size": PAGE_SIZE, "cap_tokens": CAP_TOKENS, "table": table, "runs": runs},
            indent=1))


if __name__ == "__main__":
    main()
