"""Model-free simulation: replay requests through Scheduler + RadixCache on a simulated clock.

No model and no GPU: each step's duration comes from a cost model (cost_model.py) and each
sampled token is a deterministic function of (rid, output position), so every policy and
pool size generates exactly the same tokens for a request and differs only in what it
caches, when it runs and how long requests wait. No torch.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from radixkv.batch import Batch
from radixkv.config import SchedulerConfig
from .cost_model import CostModel, StepTimer
from .fragmentation import Fragmentation
from radixkv.scheduler.metrics import SchedulerMetrics, TimelinePoint
from radixkv.cache.pages import PagePool
from radixkv.cache.radix_tree import RadixCache
from radixkv.request import Request
from radixkv.scheduler.entry import worst_case_pages
from radixkv.scheduler.scheduler import Scheduler

FAKE_VOCAB = 32000


def fake_token(rid: int, index: int) -> int:
    """The simulated model's output token `index` of request `rid` (deterministic)."""
    return (rid * 1_000_003 + index * 7_919 + 12_345) % FAKE_VOCAB


@dataclass
class SimResult:
    """One simulated replay. `as_json()` gives the replay's `--json` keys (docs/replay.md) (the caller adds wall_s).

    `metrics` and `pool` are the run's own scheduler counters and page pool (cache cleared), from
    which the summary fields are taken and `ReplayResult.build` derives its own.
    """

    requests: int
    completed: int
    prompt_tokens: int
    hit_tokens: int
    hit_rate: float
    peak_pages: int
    preemptions: int
    wait_p50_s: float
    wait_p99_s: float
    wait_max_s: float
    leaked_pages: int
    sim_seconds: float
    steps: int
    metrics: SchedulerMetrics = field(repr=False)
    pool: PagePool = field(repr=False)
    timeline: list[TimelinePoint] = field(default_factory=list, repr=False)
    outputs: dict[int, list[int]] = field(default_factory=dict, repr=False)  # rid -> tokens
    fragmentation: Fragmentation | None = field(default=None, repr=False)  # live tokens at peak
    host: HostStats | None = field(default=None, repr=False)  # the host tier's counters (None: no tier)

    def as_json(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items()
             if k not in ("timeline", "outputs", "metrics", "pool", "fragmentation", "host")}
        f = self.fragmentation
        d["live_token_fraction"] = f.live_token_fraction if f else None
        d["contiguous_live_fraction"] = f.contiguous_live_fraction if f else None
        return d


def _fresh_copy(req: Request, arrival_s: float) -> Request:
    return Request(req.rid, req.prompt, req.max_tokens, arrival_s=arrival_s,
                   namespace=req.namespace, stop_token_ids=req.stop_token_ids)


class KVShadow:
    """Simulated K/V content, to check what a scheduler hands the model (tests use it).

    Every slot holds the identity of the prefix whose last token's K/V it stores (a rolling
    hash of namespace + tokens[:pos + 1]). `check(batch)` asserts, per row, that the new
    tokens are the request's own tokens at those positions, that every earlier position reads
    a slot holding exactly its prefix (cache hits, shared pages, recomputation after
    preemption), and that new K/V only goes to pages nobody else holds; then it writes them.
    """

    def __init__(self, pool: PagePool, page_size: int) -> None:
        self.pool = pool
        self.page_size = page_size
        self.slots: dict[int, int] = {}
        self._prefix: dict[int, list[int]] = {}  # rid -> prefix hash of each position

    def _hashes(self, req: Request, n: int) -> list[int]:
        h = self._prefix.setdefault(req.rid, [])
        if len(h) < n:
            tokens = req.tokens
            prev = h[-1] if h else hash(("ns", req.namespace))
            for t in tokens[len(h): n]:
                prev = hash((prev, t))
                h.append(prev)
        return h

    def check(self, batch: Batch) -> None:
        ps = self.page_size
        batch.check()
        for b, req in enumerate(batch.requests):
            seq, q, table = batch.seq_lens[b], batch.q_lens[b], batch.page_tables[b]
            h = self._hashes(req, seq)
            tokens = req.tokens
            start = batch.q_start[b]
            assert batch.input_ids[start: start + q] == tokens[seq - q: seq], \
                f"request {req.rid}: row tokens are not its tokens {seq - q}..{seq}"
            for pos in range(seq - q):
                slot = table[pos // ps] * ps + pos % ps
                assert self.slots.get(slot) == h[pos], \
                    f"request {req.rid}: position {pos} reads page {table[pos // ps]} holding other K/V"
            for i, pos in enumerate(range(seq - q, seq)):
                page = table[pos // ps]
                assert self.pool.refcount(page) == 1, \
                    f"request {req.rid}: writes position {pos} into shared page {page}"
                self.slots[batch.slots[start + i]] = h[pos]


def run_scheduler(scheduler: Scheduler, arrivals: list[Request],
                  step_seconds: Callable[[Batch], float],
                  on_batch: Callable[[Batch], None] | None = None,
                  progress: Callable[[int], None] | None = None,
                  after_update: Callable[[list[Request]], None] | None = None) -> float:
    """Drive `scheduler` until every request of `arrivals` (sorted by arrival_s) finished.

    Each request is added once the clock reaches its arrival_s; a step lasts
    step_seconds(batch); sampled tokens are fake_token(rid, position). `on_batch` sees every
    batch before its results are applied; `after_update` is called once they are (after each
    `scheduler.update`, with the requests it finished). Returns the final clock."""
    now = 0.0
    nxt = 0
    done_count = 0
    while nxt < len(arrivals) or scheduler.has_work():
        while nxt < len(arrivals) and arrivals[nxt].arrival_s <= now:
            scheduler.add(arrivals[nxt], arrivals[nxt].arrival_s)  # waits count from arrival
            nxt += 1
        batch = scheduler.schedule(now)
        if batch is None:
            if nxt == len(arrivals):
                raise RuntimeError(f"scheduler stalled with {scheduler.num_waiting} waiting and "
                                   f"{scheduler.num_running} running requests")
            now = max(now, arrivals[nxt].arrival_s)
            continue
        if on_batch is not None:
            on_batch(batch)
        now += step_seconds(batch)
        tokens = [fake_token(r.rid, len(r.output)) if s else None
                  for r, s in zip(batch.requests, batch.sample)]
        done = scheduler.update(batch, tokens, now)
        if after_update is not None:
            after_update(done)
        if done and progress is not None:
            done_count += len(done)
            progress(done_count)
    return now


def check_requests(requests: Sequence[Request], num_pages: int, page_size: int, caller: str, pool: str) -> None:
    """ValueError unless the rids are distinct and each request fits `pool` of `num_pages` alone."""
    rids = [r.rid for r in requests]
    if len(set(rids)) != len(rids):
        raise ValueError(f"{caller} needs distinct request ids")
    for r in requests:
        if worst_case_pages(r, page_size) > num_pages:
            raise ValueError(f"request {r.rid} needs up to {worst_case_pages(r, page_size)} pages "
                             f"but {pool} has {num_pages}")


@dataclass(frozen=True)
class HostStats:
    """What a replay's host tier did: its size, blocks loaded back (host hits) and written back."""

    host_pages: int
    page_size: int
    promoted_pages: int  # blocks copied host -> GPU (their tokens: host hit tokens)
    demoted_pages: int  # blocks copied GPU -> host (write-back)
    kv_bytes_per_token: float

    @property
    def host_hit_tokens(self) -> int:
        return self.promoted_pages * self.page_size

    @property
    def bytes_h2d(self) -> int:
        return int(self.promoted_pages * self.page_size * self.kv_bytes_per_token)

    @property
    def bytes_d2h(self) -> int:
        return int(self.demoted_pages * self.page_size * self.kv_bytes_per_token)


def simulate(requests: list[Request], num_pages: int, page_size: int, sched: SchedulerConfig,
             cost: StepTimer, burst: bool = False,
             progress: Callable[[int], None] | None = None, host_pages: int | None = None) -> SimResult:
    """Serve `requests` (arriving at req.arrival_s, or all at 0 when `burst`) to completion.

    The given Request objects are not modified (each is copied; prompts are shared, not
    copied). The clock advances by cost.step_seconds(batch) per step and jumps over idle gaps
    to the next arrival. At the end the cache is cleared and leaked_pages counts pages still
    not free. `progress`, if given, is called with the number of completed requests whenever
    it changes. `fragmentation` holds the live tokens at the peak of pages in use and the
    contiguous-allocator baseline (radixkv.replay.fragmentation). Raises ValueError for duplicate rids or a request larger than the pool.

    host_pages: a host tier of that many pages under the pool (radixkv.replay.host_tier: GPU eviction
    writes blocks back to host, an admission that reaches them loads them back, each load priced by
    `cost.transfer_seconds` when `cost` is a CostModel); None or 0: no tier.
    """
    check_requests(requests, num_pages, page_size, "simulate()", "the pool")
    pool = PagePool(num_pages)
    step_seconds = cost.step_seconds
    if host_pages:
        from radixkv.cache.tree_host import HostPool
        from .host_tier import LoadingCache, TransferTimer

        cache: RadixCache = LoadingCache(pool, page_size=page_size, host_pool=HostPool(host_pages))
        if isinstance(cost, CostModel):
            step_seconds = TransferTimer(cost, cache).step_seconds
    else:
        cache = RadixCache(pool, page_size=page_size)
    scheduler = Scheduler(pool, cache, sched, page_size)
    arrivals = sorted((_fresh_copy(r, 0.0 if burst else r.arrival_s) for r in requests),
                      key=lambda r: r.arrival_s)  # stable: file order among equal times
    frag = Fragmentation(page_size)
    now = run_scheduler(scheduler, arrivals, step_seconds, progress=progress,
                        after_update=lambda done: frag.observe(scheduler, done))
    host = None
    if host_pages:
        host = HostStats(host_pages, page_size, cache.promoted_pages, cache.demoted_pages,
                         getattr(cost, "kv_bytes_per_token", CostModel.kv_bytes_per_token))
    if host_pages:
        cache.clear()  # both tiers
    else:
        cache.evict(cache.num_cached_pages)
    m = scheduler.metrics
    waits = m.wait_stats()
    return SimResult(
        requests=len(requests), completed=m.completed, prompt_tokens=m.prompt_tokens,
        hit_tokens=m.hit_tokens, hit_rate=m.hit_rate, peak_pages=m.peak_pages,
        preemptions=m.preemptions, wait_p50_s=waits.p50, wait_p99_s=waits.p99,
        wait_max_s=waits.max, leaked_pages=num_pages - pool.num_free, sim_seconds=now,
        steps=m.steps, timeline=m.timeline,
        outputs={r.rid: r.output for r in arrivals}, metrics=m, pool=pool, fragmentation=frag, host=host)
