"""The host KV tier on one GPU (issue 37): copy bandwidth against the link, and an over-subscribed multi-turn
conversation workload with the tier and without.

Llama-3-8B shape, random bf16 weights from a config (nothing downloaded), page 16.
(a) The link: one large pinned host<->device copy each way (`link_gbps`). Then the tier's own copies
    (engine/host_kv.py HostKV.demote / promote, which gather the pages of every layer through a device
    staging buffer) over a KVStore of the same shape, for both host layouts (page-first: one host range per
    run of host pages; layer-first: one per run per layer tensor), with the GPU pages scattered and the host
    pages in runs (as a fresh host pool hands them out) and scattered too.
(b) Conversations: --convs chats, each a unique --system-token start, --turns turns of --user new tokens
    and --new output tokens; each turn sends the whole history again. Chats are served round-robin in waves
    of --wave concurrent requests, and the GPU pool (--gpu-tokens) holds about one wave, so a chat's history
    is evicted before its next turn: without the tier it is recomputed, with it it is loaded back. One engine
    (one model, one set of CUDA graphs): the tier run swaps in a fresh EngineCore with host_kv_cache_bytes.
    TTFT: from a wave's submission to each request's first token; output tok/s: output tokens / wall time.
    `hit_rate_unlimited`: the same requests through a radix tree with no size limit.

Rows (--json, merged by `workload`) have exactly the keys workload, gpu_tokens, host_tokens, hit_rate,
hit_rate_unlimited, ttft_p50_ms, output_tok_s, h2d_gbps, link_gbps (null where one does not apply). A copy row
names its direction in `workload`; its `h2d_gbps` holds the achieved rate of that direction (for a `d2h` row,
device-to-host) and `link_gbps` the single large copy's rate in the same direction.

    python benchmarks/engine/host_tier_gpu.py --json benchmarks/results/host_tier.json      # H200, ~3-4 min
    python benchmarks/engine/host_tier_gpu.py --smoke --json /tmp/host_tier_smoke.json       # CPU, tiny model
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_engine_check import llama3_8b_config  # noqa: E402

from radixkv import LLM, SamplingParams  # noqa: E402
from radixkv.cache import PagePool, RadixCache  # noqa: E402
from radixkv.engine.core import EngineCore, EngineStats  # noqa: E402
from radixkv.engine.host_kv import LAYOUTS, HostKV  # noqa: E402
from radixkv.engine.kv_store import KVStore  # noqa: E402

KEYS = ("workload", "gpu_tokens", "host_tokens", "hit_rate", "hit_rate_unlimited", "ttft_p50_ms", "output_tok_s",
        "h2d_gbps", "link_gbps")
PAGE = 16


def row(**kw: Any) -> dict[str, Any]:
    return {k: kw.get(k) for k in KEYS}


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def timed(fn: Any, dev: torch.device, reps: int) -> float:
    """Best seconds of `reps` runs of fn (one warm run first)."""
    fn()
    sync(dev)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        sync(dev)
        best = min(best, time.perf_counter() - t)
    return best


# ---------------------------------------------------------------- (a) copies
def link_rates(nbytes: int, dev: torch.device, reps: int) -> tuple[float, float]:
    """GB/s of one pinned host -> device and one device -> host copy of nbytes."""
    pin = dev.type == "cuda"
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)
    gpu = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    h2d = timed(lambda: gpu.copy_(host, non_blocking=True), dev, reps)
    d2h = timed(lambda: host.copy_(gpu, non_blocking=True), dev, reps)
    return nbytes / h2d / 1e9, nbytes / d2h / 1e9


def tier_rates(cfg: Any, pages: int, dev: torch.device, layout: str, scattered_host: bool, reps: int,
               dtype: torch.dtype) -> tuple[float, float]:
    """GB/s of HostKV.promote / demote of `pages` pages (GPU ids shuffled; host ids in one run, or shuffled)."""
    hd = cfg.hidden_size // cfg.num_attention_heads
    kv = KVStore(cfg.num_hidden_layers, pages * 2, PAGE, cfg.num_key_value_heads, hd,
                 "bf16" if dtype == torch.bfloat16 else "fp32", dev, dtype)
    host = HostKV(kv, pages * 2, layout)
    if dev.type == "cuda" and not host._flat.is_pinned():
        raise RuntimeError("host tier: the host pages are not pinned")
    rng = np.random.default_rng(0)
    g = rng.permutation(pages * 2)[:pages].astype(np.int32)
    h = (rng.permutation(pages * 2)[:pages] if scattered_host else np.arange(pages)).astype(np.int32)
    nbytes = pages * host.page_bytes
    check_round_trip(kv, host, g, h)
    d2h = timed(lambda: (host.demote(g, h), host.synchronize()), dev, reps)
    h2d = timed(lambda: (host.promote(h, g), host.synchronize()), dev, reps)
    del host, kv
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return nbytes / h2d / 1e9, nbytes / d2h / 1e9


def profile_copy(cfg: Any, pages: int, dev: torch.device, scattered_host: bool, dtype: torch.dtype) -> None:
    """torch.profiler over one page-first demotion of `pages` pages: the wall, the device-to-host copies' time and
    count, the gathers' kernel time, and the link's idle share (what the copy rate loses, and where)."""
    from torch.profiler import ProfilerActivity, profile

    hd = cfg.hidden_size // cfg.num_attention_heads
    kv = KVStore(cfg.num_hidden_layers, pages * 2, PAGE, cfg.num_key_value_heads, hd,
                 "bf16" if dtype == torch.bfloat16 else "fp32", dev, dtype)
    host = HostKV(kv, pages * 2, "page")
    rng = np.random.default_rng(0)
    g = rng.permutation(pages * 2)[:pages].astype(np.int32)
    h = (np.sort(rng.permutation(pages * 2)[:pages]) if scattered_host else np.arange(pages)).astype(np.int32)
    host.demote(g, h)
    host.synchronize()
    acts = [ProfilerActivity.CUDA] if dev.type == "cuda" else [ProfilerActivity.CPU]
    with profile(activities=acts) as prof:
        t = time.perf_counter()
        host.demote(g, h)
        host.synchronize()
        wall = time.perf_counter() - t
    evs = [e for e in prof.events() if getattr(e, "device_type", None) is not None and e.device_type.name == "CUDA"]
    copies = [e for e in evs if "Memcpy DtoH" in e.name]
    kernels = [e for e in evs if "Memcpy" not in e.name]
    busy = sum(e.time_range.elapsed_us() for e in copies) / 1e3 or float("nan")  # (none on CPU)
    spans = sorted((e.time_range.start, e.time_range.end) for e in copies)
    gaps = [b[0] - a[1] for a, b in zip(spans, spans[1:]) if b[0] > a[1]]
    print(f"  profile d2h {'scattered' if scattered_host else 'one run'}: wall {wall * 1e3:.1f} ms, "
          f"{len(copies)} copies {busy:.1f} ms ({pages * host.page_bytes / busy / 1e6:.1f} GB/s while copying), "
          f"gaps between copies {sum(gaps) / 1e3:.1f} ms (largest {max(gaps, default=0) / 1e3:.2f}), "
          f"{len(kernels)} kernels {sum(e.time_range.elapsed_us() for e in kernels) / 1e3:.1f} ms", flush=True)


def check_round_trip(kv: KVStore, host: HostKV, g: np.ndarray, h: np.ndarray) -> None:
    """Demote pages g, overwrite them, promote them back: every byte must come back (RuntimeError if not)."""
    for t in [*kv.k_cache, *kv.v_cache]:
        t.copy_(torch.randn(t.shape, device=t.device).to(t.dtype))
    idx = torch.from_numpy(g.astype(np.int64)).to(kv.device)
    want = [t.index_select(0, idx).clone() for t in kv.k_cache]
    host.demote(g, h)
    host.fence()  # what the engine does before a step: the overwrite below is ordered after the copy
    for t in kv.k_cache:
        t.index_fill_(0, idx, 0)
    host.promote(h, g)
    host.synchronize()
    for layer, (t, w) in enumerate(zip(kv.k_cache, want)):
        if not torch.equal(t.index_select(0, idx), w):
            raise RuntimeError(f"host tier ({host.layout}-first): layer {layer}'s K pages differ after demote + promote")


# ---------------------------------------------------------------- (b) conversations
@dataclasses.dataclass
class Chats:
    hist: list[list[int]]
    rng: random.Random
    vocab: int

    @classmethod
    def make(cls, convs: int, system: int, vocab: int, seed: int = 0) -> Chats:
        rng = random.Random(seed)
        return cls([[rng.randrange(100, vocab) for _ in range(system)] for _ in range(convs)], rng, vocab)

    def add_user(self, c: int, n: int) -> list[int]:
        self.hist[c] = self.hist[c] + [self.rng.randrange(100, self.vocab) for _ in range(n)]
        return self.hist[c]


def run_chats(llm: LLM, a: argparse.Namespace, vocab: int) -> tuple[list[float], int, float, list[tuple[list[int], list[int]]]]:
    """Serve the conversations; (TTFTs in seconds, output tokens, wall seconds, (prompt, output) per request)."""
    chats = Chats.make(a.convs, a.system, vocab)
    params = SamplingParams(max_tokens=a.new, temperature=0.0, ignore_eos=True)
    ttfts, done, out_tokens = [], [], 0
    t0 = time.perf_counter()
    for _ in range(a.turns):
        for w in range(0, a.convs, a.wave):
            ids = list(range(w, min(w + a.wave, a.convs)))
            prompts = [list(chats.add_user(c, a.user)) for c in ids]
            start = time.perf_counter()
            reqs = llm.add_requests(prompts, params)
            first: dict[int, float] = {}
            while llm.has_work():
                llm.step()
                now = time.perf_counter()
                for r in reqs:
                    if r.rid not in first and r.output:
                        first[r.rid] = now - start
            ttfts += list(first.values())
            for c, p, r in zip(ids, prompts, reqs):
                out = list(r.output)
                out_tokens += len(out)
                done.append((p, out))
                chats.hist[c] = chats.hist[c] + out
    return ttfts, out_tokens, time.perf_counter() - t0, done


def unlimited_hit_rate(done: list[tuple[list[int], list[int]]]) -> float:
    """Hit rate of the same requests in order through a tree that never evicts (the engine's rule: a hit
    leaves >= 1 prompt token to compute; a finished request caches its prompt and output blocks)."""
    total = sum(len(p) + len(o) for p, o in done)
    pool = PagePool(total // PAGE + 1)
    cache = RadixCache(pool, PAGE)
    hits = prompt = 0
    for p, o in done:
        m = cache.match(p)
        hits += min(m.num_tokens, (len(p) - 1) // PAGE * PAGE)
        prompt += len(p)
        seq = (p + o)[: len(p) + len(o) - 1]  # the last output token's K/V is never computed
        pages = pool.alloc(len(seq) // PAGE)
        cache.insert(seq, pages)
        pool.decref(pages)
    return hits / prompt


def time_calls(llm: LLM) -> dict[str, float]:
    """--timers: host seconds spent in the engine's step parts and the host tier's calls (wrapped in place)."""
    spent: dict[str, float] = {}
    targets = [(llm.core.scheduler, "schedule"), (llm.core.scheduler, "update"), (llm.runner, "launch"),
               (llm.runner, "collect"), (llm.core.scheduler, "_load_host")]
    if llm.core.host_kv is not None:
        targets += [(llm.core.host_kv, "demote"), (llm.core.host_kv, "promote"), (llm.core.host_kv, "fence")]
    for obj, name in targets:
        fn = getattr(obj, name)

        def wrapped(*args: Any, _fn: Any = fn, _name: str = name, **kw: Any) -> Any:
            t = time.perf_counter()
            try:
                return _fn(*args, **kw)
            finally:
                spent[_name] = spent.get(_name, 0.0) + time.perf_counter() - t
        setattr(obj, name, wrapped)
    return spent


def since(s: EngineStats, before: EngineStats) -> EngineStats:
    """The counters of `s` less those of `before` (the core's are totals since it started)."""
    counters = ("prompt_tokens", "hit_tokens", "preemptions", "num_steps", "mixed_steps", "host_hit_tokens",
                "bytes_d2h", "bytes_h2d", "failed_copies")
    return dataclasses.replace(s, **{k: getattr(s, k) - getattr(before, k) for k in counters})


def chat_rows(a: argparse.Namespace, dev: torch.device, dtype: torch.dtype) -> list[dict[str, Any]]:
    cfg = llama3_8b_config(a.smoke)
    gpu_pages = a.gpu_tokens // PAGE
    llm = LLM(cfg, dtype=dtype, device=dev.type, page_size=PAGE, num_pages=gpu_pages, max_num_seqs=a.wave * 2,
              warmup=False)
    vocab = cfg.vocab_size
    # compile every kernel shape the workload reaches, outside the timing (a short copy of it)
    warm = argparse.Namespace(**{**vars(a), "convs": min(a.convs, a.wave), "turns": 2, "system": a.system // 4})
    run_chats(llm, warm, vocab)
    llm.reset_prefix_cache()
    base_core, rows = llm.core, []
    per_page = llm.runner.kv.total_bytes // llm.runner.kv.num_pages
    host_bytes = a.host_bytes or (a.convs * (a.system + a.turns * (a.user + a.new)) // PAGE + 64) * per_page
    for tier in (False, True):
        if tier:
            llm.core = EngineCore(llm.runner, dataclasses.replace(llm.config, host_kv_cache_bytes=host_bytes))
            llm.core.grammars = base_core.grammars
        before = llm.core.stats()
        spent = time_calls(llm) if a.timers else None
        ttfts, out_tokens, wall, done = run_chats(llm, a, vocab)
        if spent is not None:
            print("  host seconds in: " + ", ".join(f"{k} {v:.3f}" for k, v in spent.items()), flush=True)
        s = since(llm.core.stats(), before)
        host_tokens = s.host_pages * PAGE if tier else 0
        rows.append(row(workload=f"multiturn {a.convs}x{a.turns} turns, {'host tier' if tier else 'GPU only'}",
                        gpu_tokens=gpu_pages * PAGE, host_tokens=host_tokens, hit_rate=round(s.hit_rate, 4),
                        hit_rate_unlimited=round(unlimited_hit_rate(done), 4),
                        ttft_p50_ms=round(1e3 * statistics.median(ttfts), 2),
                        output_tok_s=round(out_tokens / wall, 1)))
        print(f"  {rows[-1]['workload']}: wall {wall:.1f} s, hits {s.hit_tokens} of {s.prompt_tokens} prompt tokens "
              f"(host {s.host_hit_tokens}), moved d2h {s.bytes_d2h / 2**30:.2f} GiB h2d {s.bytes_h2d / 2**30:.2f} GiB, "
              f"failed copies {s.failed_copies}, preemptions {s.preemptions}", flush=True)
    return rows


def copy_rows(a: argparse.Namespace, dev: torch.device, dtype: torch.dtype) -> list[dict[str, Any]]:
    cfg = llama3_8b_config(a.smoke)
    reps = 1 if a.smoke else 3
    link_h2d, link_d2h = link_rates(a.link_mib << 20, dev, reps)
    rows = [row(workload="copy h2d: one large pinned copy (the link)", h2d_gbps=round(link_h2d, 2),
                link_gbps=round(link_h2d, 2)),
            row(workload="copy d2h: one large pinned copy (the link)", h2d_gbps=round(link_d2h, 2),
                link_gbps=round(link_d2h, 2))]
    for layout in LAYOUTS:
        for scattered in (False, True):
            h2d, d2h = tier_rates(cfg, a.copy_pages, dev, layout, scattered, reps, dtype)
            name = f"{layout}-first, host pages {'scattered' if scattered else 'in one run'}"
            rows.append(row(workload=f"copy h2d: host tier {name}", h2d_gbps=round(h2d, 2), link_gbps=round(link_h2d, 2)))
            rows.append(row(workload=f"copy d2h: host tier {name}", h2d_gbps=round(d2h, 2), link_gbps=round(link_d2h, 2)))
    return rows


def fmt(v: Any) -> str:
    return "-" if v is None else f"{v:,}" if isinstance(v, int) else str(v)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny model, small sizes: checks this script")
    ap.add_argument("--json", help="merge the rows (by workload) into this JSON file")
    ap.add_argument("--convs", type=int, default=32)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--system", type=int, default=1536, help="unique tokens each conversation starts with")
    ap.add_argument("--user", type=int, default=128, help="new user tokens a turn")
    ap.add_argument("--new", type=int, default=32, help="output tokens a turn")
    ap.add_argument("--wave", type=int, default=8, help="conversations served at once")
    ap.add_argument("--gpu-tokens", type=int, default=24576, help="the GPU pool (about one wave's histories)")
    ap.add_argument("--host-bytes", type=int, help="the host tier (default: every conversation's history)")
    ap.add_argument("--copy-pages", type=int, default=512, help="pages per timed tier copy (1 GiB at 8B)")
    ap.add_argument("--link-mib", type=int, default=2048)
    ap.add_argument("--skip-chats", action="store_true")
    ap.add_argument("--skip-copies", action="store_true")
    ap.add_argument("--timers", action="store_true", help="print host seconds in the step's parts")
    ap.add_argument("--profile-copies", action="store_true", help="only: torch.profiler of page-first demotions")
    a = ap.parse_args()
    if a.smoke:
        a.convs, a.turns, a.system, a.user, a.new, a.wave = 6, 2, 48, 16, 4, 2
        a.gpu_tokens, a.copy_pages, a.link_mib = 256, 16, 8
    dev = torch.device("cpu" if a.smoke or not torch.cuda.is_available() else "cuda")
    dtype = torch.float32 if dev.type == "cpu" else torch.bfloat16
    if a.profile_copies:
        for scattered in (False, True):
            profile_copy(llama3_8b_config(a.smoke), a.copy_pages, dev, scattered, dtype)
        return
    t0 = time.perf_counter()
    rows = [] if a.skip_copies else copy_rows(a, dev, dtype)
    print(f"copies measured in {time.perf_counter() - t0:.0f} s", flush=True)
    if not a.skip_chats:
        rows += chat_rows(a, dev, dtype)
    if a.json:
        path = Path(a.json)
        old = json.loads(path.read_text()) if path.exists() else []
        old = old if isinstance(old, list) else old.get("rows", [])
        names = {r["workload"] for r in rows}
        path.write_text(json.dumps([r for r in old if r.get("workload") not in names] + rows, indent=1) + "\n")
    print(f"\nhost tier on {torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'CPU (smoke)'}, "
          f"{time.perf_counter() - t0:.0f} s")
    print("| " + " | ".join(KEYS) + " |\n|" + "---|" * len(KEYS))
    for r in rows:
        print("| " + " | ".join(fmt(r[k]) for k in KEYS) + " |")


if __name__ == "__main__":
    main()
