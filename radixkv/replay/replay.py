"""Replay a trace through the prefix cache: sequentially (exact), through the scheduler
simulator (a cost model stands in for the model), or through the engine (real mode). No torch
unless real mode is asked for.

Sequential replay serves requests one at a time in file order straight on PagePool + RadixCache:
match (hit tokens), lock the match, evict LRU leaves when the pool is short, allocate pages for
the rest of the prompt, insert the prompt's full blocks, release. Its hit rate is exact and
comparable across runs; its clock is the cost model's (one request at a time; a request starts
when it has arrived, at 0 under `burst`, and the previous one has finished; wait = start - arrival).
"""
from __future__ import annotations

import enum
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from radixkv.cache.node import as_tokens
from radixkv.cache.pages import PagePool
from radixkv.cache.radix_tree import RadixCache
from radixkv.config import Policy, SchedulerConfig
from radixkv.scheduler.metrics import SchedulerMetrics, TimelinePoint, wait_stats
from radixkv.workloads.traces import HashedPrompt, TraceRequest
from .cost_model import CostModel, ServiceTime
from .fragmentation import Fragmentation

if TYPE_CHECKING:  # real mode only; importing the engine loads torch
    from .simulator import HostStats
    from radixkv.engine.llm import LLM
    from radixkv.request import Request

Progress = Callable[[int], None]  # called with the number of requests just finished


class ReplayMode(enum.Enum):
    SEQUENTIAL = "sequential"  # one request at a time, file order, exact hit rate
    SIMULATE = "simulate"  # arrivals at their timestamps (or all at 0), scheduler + cost model
    REAL = "real"  # the engine runs a model


MAX_HOST_PAGES = 2**31 - 1  # host page ids are int32, as GPU ones


def check_host_pages(n: object) -> int:
    """A host tier size in pages: an integer in [0, 2**31); ValueError naming the value otherwise."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise ValueError(f"host pages must be a whole number of pages, got {n!r}")
    if not 0 <= n <= MAX_HOST_PAGES:
        raise ValueError(f"host pages must be between 0 and {MAX_HOST_PAGES:,} (int32 page ids), got {n:,}")
    return int(n)


@dataclass(frozen=True)
class ReplayConfig:
    """How to replay. `num_pages=None` sizes the pool so nothing is ever evicted (unlimited).

    sequential: one request at a time in file order (exact hit rates); otherwise requests arrive
    at their timestamps (all at 0 with `burst`) and the scheduler runs up to `concurrency` at once
    under `policy`.
    """

    page_size: int = 16
    num_pages: int | None = None
    sequential: bool = False
    concurrency: int = 256  # SchedulerConfig.max_running
    burst: bool = False  # every request arrives at t=0
    policy: Policy = Policy.LPM
    host_pages: int | None = None  # a host tier of this many pages under the pool (None/0: none)

    def __post_init__(self) -> None:
        if self.host_pages is not None:
            check_host_pages(self.host_pages)
        if self.page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {self.page_size}")
        if self.num_pages is not None and self.num_pages < 1:
            raise ValueError(f"num_pages must be >= 1, got {self.num_pages}")
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if not isinstance(self.policy, Policy):
            raise TypeError(f"policy must be a Policy, got {self.policy!r}")

    @property
    def host_tier(self) -> bool:
        return bool(self.host_pages)

    def scheduler_config(self) -> SchedulerConfig:
        """The scheduler settings of a simulated or real replay (policy, `concurrency` running)."""
        return SchedulerConfig(policy=self.policy, max_running=self.concurrency)


@dataclass
class ReplayResult:
    """Summary of one replay. The first twelve fields are `radixkv replay --json`'s keys (docs/replay.md).

    Made by `ReplayResult.build` from what a replay driver measured (all three modes).
    """

    requests: int
    completed: int
    prompt_tokens: int  # prompt tokens counted (sequential: all; simulated/real: admitted requests)
    hit_tokens: int  # of those, tokens served from the prefix cache
    hit_rate: float  # hit_tokens / prompt_tokens
    peak_pages: int
    preemptions: int
    wait_p50_s: float
    wait_p99_s: float
    wait_max_s: float
    leaked_pages: int  # pages not free after every request finished and the cache was cleared
    wall_s: float  # real seconds of the replay (loading excluded)
    mode: ReplayMode
    page_size: int
    num_pages: int  # pool size used
    unlimited: bool  # pool sized so that nothing is ever evicted
    rejected: int = 0  # requests larger than the whole pool: never run
    too_long: int = 0  # real mode: prompt + max_tokens longer than the model's context: never run
    model_context: int | None = None  # real mode: the model's context in tokens (None: no model)
    sim_seconds: float = 0.0  # clock at the last finish
    output_tokens: int = 0
    # live tokens / allocated KV (pages in use x page_size) where pages in use peak, and the same for
    # a contiguous allocator reserving prompt + max_tokens per running request (fragmentation.py)
    live_token_fraction: float | None = None
    contiguous_live_fraction: float | None = None
    timeline: list[TimelinePoint] = field(default_factory=list)
    # host tier (issue 37; None / 0 without one): its size, prompt tokens loaded back from it (host
    # hits; hit_tokens includes them, gpu_hit_tokens is the rest), bytes copied each way
    host_pages: int | None = None
    host_hit_tokens: int = 0
    gpu_hit_tokens: int | None = None
    bytes_h2d: int = 0
    bytes_d2h: int = 0

    @classmethod
    def build(cls, mode: ReplayMode, cfg: ReplayConfig, *, requests: int, metrics: SchedulerMetrics,
              pool: PagePool, started: float, clock_s: float, output_tokens: int, rejected: int = 0,
              too_long: int = 0, model_context: int | None = None,
              fragmentation: Fragmentation | None = None, host: HostStats | None = None) -> ReplayResult:
        """The one constructor of a replay's summary, from what its driver measured.

        metrics: the run's counters (prompt and hit tokens, preemptions, completed requests, peak
        pages, per-request waits, timeline); hit_rate and the wait percentiles derive from them.
        pool: the run's page pool once every request finished and the cache was cleared; its size
        is `num_pages` and its pages not free are `leaked_pages`. fragmentation: live tokens at the
        peak (None: not measured, both fractions None). started: `time.perf_counter()`
        when the replay began (wall_s runs to now). clock_s: the replay clock at the last finish.
        """
        w = wait_stats(metrics.waits_s)
        return cls(
            requests=requests, completed=metrics.completed, prompt_tokens=metrics.prompt_tokens,
            hit_tokens=metrics.hit_tokens, hit_rate=metrics.hit_rate, peak_pages=metrics.peak_pages,
            preemptions=metrics.preemptions, wait_p50_s=w.p50, wait_p99_s=w.p99, wait_max_s=w.max,
            leaked_pages=pool.num_pages - pool.num_free, wall_s=time.perf_counter() - started, mode=mode,
            page_size=cfg.page_size, num_pages=pool.num_pages,
            unlimited=mode is not ReplayMode.REAL and cfg.num_pages is None, rejected=rejected,
            too_long=too_long, model_context=model_context, sim_seconds=clock_s, output_tokens=output_tokens,
            live_token_fraction=fragmentation.live_token_fraction if fragmentation else None,
            contiguous_live_fraction=fragmentation.contiguous_live_fraction if fragmentation else None,
            timeline=list(metrics.timeline),
            host_pages=host.host_pages if host else None,
            host_hit_tokens=host.host_hit_tokens if host else 0,
            gpu_hit_tokens=metrics.hit_tokens - host.host_hit_tokens if host else metrics.hit_tokens,
            bytes_h2d=host.bytes_h2d if host else 0, bytes_d2h=host.bytes_d2h if host else 0)

    def to_json(self) -> dict[str, Any]:
        """Every field, JSON-ready (`mode` as its name, timeline points as lists)."""
        d = asdict(self)
        d["mode"] = self.mode.value
        d["timeline"] = [list(p) for p in self.timeline]
        return d


def unlimited_pages(requests: Sequence[TraceRequest], page_size: int, with_outputs: bool) -> int:
    """A pool size that never runs out: every page any request could ever hold, all at once
    (prompt pages, plus output pages when the outputs are cached too), plus one spare."""
    lengths = np.fromiter((r.num_prompt_tokens + (r.max_tokens if with_outputs else 0) for r in requests),
                          dtype=np.int64, count=len(requests))
    return int((-(-lengths // page_size)).sum()) + 1


class Served(NamedTuple):
    hit_tokens: int  # prompt tokens matched in the tree
    ran: bool  # False: the request needed more pages than the whole pool
    pages_in_use: int  # pool pages used while the request held its own (its peak)


class _SequentialServer:
    """The pool and tree of a sequential replay: one request's prompt at a time."""

    def __init__(self, num_pages: int, page_size: int, host_pages: int | None = None) -> None:
        self.pool = PagePool(num_pages)
        if host_pages:
            from radixkv.cache.tree_host import HostPool

            self.cache = RadixCache(self.pool, page_size=page_size, host_pool=HostPool(host_pages))
        else:
            self.cache = RadixCache(self.pool, page_size=page_size)
        self.page_size = page_size

    def serve(self, tokens: Sequence[int] | np.ndarray) -> Served:
        """Match, evict LRU leaves if short, allocate, cache the full blocks, release
        (`RadixCache.serve_prompt`: one walk down the tree, the new blocks cached below the
        match with pages the tree then holds alone, the partial tail page only counted).

        `tokens`: an int32 array is used as it is (no copy); any other container is checked and
        converted once. A request needing more pages than the pool can give even after evicting
        everything else does not run: it evicts and inserts nothing.
        """
        tokens = as_tokens(tokens)
        return Served(*self.cache.serve_prompt(tokens, int(len(tokens) % self.page_size != 0)))


def _expansion_scratch(requests: Sequence[TraceRequest]) -> np.ndarray | None:
    """An int32 array large enough to expand any of the requests' hash-id prompts into."""
    size = max((len(p.hash_ids) * p.block_tokens for p in (r.prompt for r in requests)
                if isinstance(p, HashedPrompt)), default=0)
    return np.empty(size, dtype=np.int32) if size else None


def replay_sequential(requests: Sequence[TraceRequest], cfg: ReplayConfig, cost: CostModel,
                      progress: Progress | None = None) -> ReplayResult:
    """Serve `requests` one at a time in the given order; exact prefix-hit accounting.

    With `cfg.num_pages` set, the pool holds that many pages and LRU leaves are evicted before
    allocating. A request needing more pages than the pool can give even after evicting
    everything else cannot run: it is counted in `rejected`, not `completed`, inserts nothing,
    and its prompt still counts (hits = its cached prefix), so `hit_rate` is always over the
    whole trace's prompt tokens, as an independent cache count has it.
    """
    t0 = time.perf_counter()
    ps = cfg.page_size
    num_pages = cfg.num_pages if cfg.num_pages is not None else unlimited_pages(requests, ps, False)
    server = _SequentialServer(num_pages, ps, cfg.host_pages)
    pool, serve_prompt = server.pool, server.cache.serve_prompt
    cache = server.cache
    service = ServiceTime(cost)
    m = SchedulerMetrics()  # filled per request here: no scheduler runs
    waits, timeline = m.waits_s, m.timeline
    output_tokens = rejected = completed = prompt_tokens = hit_tokens = peak = 0
    clock = 0.0
    scratch = _expansion_scratch(requests)  # hash ids expand into one reused array
    frag = Fragmentation(ps)
    for r in requests:
        tokens = as_tokens(r.tokens(scratch))  # int32 [L]; the tree copies what it keeps
        n = len(tokens)
        loaded = cache.promoted_pages
        hit, ran, in_use = serve_prompt(tokens, int(n % ps != 0))
        loaded = (cache.promoted_pages - loaded) * ps  # host hit tokens (0 without a host tier)
        prompt_tokens += n
        hit_tokens += hit
        if not ran:
            rejected += 1
        else:
            peak = max(peak, in_use)
            frag.observe_prompt(in_use, n, r.max_tokens)
            arrival = 0.0 if cfg.burst else r.arrival_s
            start = max(clock, arrival)
            clock = start + service.serve(n, hit, r.max_tokens)
            if loaded:
                clock += cost.transfer_seconds(loaded)
            waits.append(start - arrival)
            completed += 1
            output_tokens += r.max_tokens
            timeline.append(TimelinePoint(clock, hit_tokens / prompt_tokens, pool.num_used))
        if progress:
            progress(1)
    m.prompt_tokens, m.hit_tokens, m.completed, m.peak_pages = prompt_tokens, hit_tokens, completed, peak
    host = None
    if cfg.host_tier:
        from .simulator import HostStats

        host = HostStats(cfg.host_pages, ps, cache.promoted_pages, cache.demoted_pages, cost.kv_bytes_per_token)
    server.cache.clear()
    return ReplayResult.build(ReplayMode.SEQUENTIAL, cfg, requests=len(requests), metrics=m, pool=pool,
                              started=t0, clock_s=clock, output_tokens=output_tokens, rejected=rejected,
                              fragmentation=frag, host=host)


class Admission(NamedTuple):
    """Which requests a simulated or real replay serves, and why the others never run."""

    ok: list[TraceRequest]
    too_large: int  # prompt + output need more pages than the whole pool
    too_long: int  # prompt + output longer than the model's context


def admit(requests: Sequence[TraceRequest], page_size: int, num_pages: int | None,
          context: int | None = None) -> Admission:
    """Split `requests` into those whose prompt + output fit the model's context (when given)
    and the pool on their own (`num_pages=None`: an unlimited pool), and count the rest; a
    request too long for the context counts as too long whatever the pool."""
    ok: list[TraceRequest] = []
    too_large = too_long = 0
    for r in requests:
        total = r.num_prompt_tokens + r.max_tokens
        if context is not None and total > context:
            too_long += 1
        elif num_pages is not None and -(-total // page_size) > num_pages:
            too_large += 1
        else:
            ok.append(r)
    return Admission(ok, too_large, too_long)


class RunningTotal:
    """A Progress fed running totals (what the simulators report): calls `progress` with each increase."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.done = 0

    def __call__(self, total: int) -> None:
        self.progress(total - self.done)
        self.done = total


def simulated_requests(requests: Sequence[TraceRequest], cfg: ReplayConfig) -> tuple[list[Request], int, int]:
    """What a simulated replay serves: the admitted requests as Requests (rid = their index among
    them, int32 prompts), how many were too large for `cfg.num_pages`, and the pool size (unlimited
    when `cfg.num_pages` is None, outputs included)."""
    from radixkv.request import Request

    served, rejected, _ = admit(requests, cfg.page_size, cfg.num_pages)
    num_pages = cfg.num_pages if cfg.num_pages is not None else unlimited_pages(served, cfg.page_size, True)
    reqs = [Request(rid=i, prompt=r.tokens(), max_tokens=r.max_tokens, arrival_s=r.arrival_s)
            for i, r in enumerate(served)]
    return reqs, rejected, num_pages


def replay_simulated(requests: Sequence[TraceRequest], cfg: ReplayConfig, cost: CostModel,
                     progress: Progress | None = None) -> ReplayResult:
    """Arrivals at their timestamps (all at 0 with `cfg.burst`) through Scheduler + RadixCache,
    the clock driven by `cost` (radixkv.replay.simulator). Prompts go in as int32 arrays."""
    from .simulator import simulate

    t0 = time.perf_counter()
    reqs, rejected, num_pages = simulated_requests(requests, cfg)
    sim = simulate(reqs, num_pages, cfg.page_size, cfg.scheduler_config(), cost, burst=cfg.burst,
                   progress=None if progress is None else RunningTotal(progress), host_pages=cfg.host_pages)
    if progress is not None and rejected:
        progress(rejected)
    return ReplayResult.build(ReplayMode.SIMULATE, cfg, requests=len(requests), metrics=sim.metrics, pool=sim.pool,
                              started=t0, clock_s=sim.sim_seconds,
                              output_tokens=sum(len(o) for o in sim.outputs.values()), rejected=rejected,
                              fragmentation=sim.fragmentation, host=sim.host)


def run_replay(requests: Sequence[TraceRequest], cfg: ReplayConfig, *, engine: LLM | None = None,
               cost: CostModel | None = None, progress: Progress | None = None) -> ReplayResult:
    """Replay: on `engine` when given (real mode; see `replay_real`), else sequentially when
    `cfg.sequential`, else through the scheduler simulator. `cost` defaults to CostModel()."""
    if engine is not None:
        if cfg.host_tier:
            raise ValueError(f"host_pages={cfg.host_pages}: the host tier is simulated only (the engine has none yet)")
        return replay_real(requests, cfg, engine, progress)
    cost = cost or CostModel()
    if cfg.sequential:
        return replay_sequential(requests, cfg, cost, progress)
    return replay_simulated(requests, cfg, cost, progress)


def fit_vocab(tokens: np.ndarray, vocab: int) -> np.ndarray:
    """Map token ids into [0, vocab), one fixed function of the id: ids already inside stay,
    larger ones (expanded hash ids) are scrambled (splitmix64 finaliser) then reduced. A plain
    modulo would make blocks 125 ids apart identical for vocab 32000 (512 * 125 = 2 * 32000),
    inventing prefix hits; scrambled, two different 16-token pages collide with odds ~vocab**-16."""
    x = tokens.astype(np.uint64)  # [L]
    big = x >= np.uint64(vocab)
    if not big.any():
        return tokens.astype(np.int64)
    h = x + np.uint64(0x9E3779B97F4A7C15)
    h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    h ^= h >> np.uint64(31)
    return np.where(big, h % np.uint64(vocab), x).astype(np.int64)


def replay_real(requests: Sequence[TraceRequest], cfg: ReplayConfig, engine: LLM,
                progress: Progress | None = None) -> ReplayResult:
    """Run the trace on `engine`; token ids are brought into the vocabulary by `fit_vocab`.

    `engine` is a fresh `LLM` (its scheduler metrics become the replay's) built by the caller
    with `cfg.page_size` pages and `cfg.scheduler_config()`, e.g.
    `LLM(model, page_size=cfg.page_size, num_pages=cfg.num_pages, scheduler=cfg.scheduler_config())`.
    Requests are added when their (wall-clock) arrival time comes, all at once with `cfg.burst`,
    or one at a time in file order, each after the previous finished, with `cfg.sequential`.
    Requests longer than the model's context (counted in `too_long`) or larger than the pool
    (`rejected`) are skipped. Hit tokens, waits, peak pages and the timeline come from the
    engine's scheduler metrics (wall seconds).
    """
    from radixkv.sampling_params import SamplingParams

    if engine.config.page_size != cfg.page_size:
        raise ValueError(f"engine page_size {engine.config.page_size} != replay page_size {cfg.page_size}")
    t0 = time.perf_counter()
    llm = engine
    vocab = llm.runner.spec.vocab_size
    window = llm.runner.spec.sliding_window  # windowed attention is not implemented: sequences stay within it
    context = llm.max_model_len if window is None else min(llm.max_model_len, window)
    ok, rejected, too_long = admit(requests, cfg.page_size, llm.num_pages, context)
    if progress is not None and rejected + too_long:
        progress(rejected + too_long)
    order = list(ok) if cfg.sequential else sorted(ok, key=lambda r: 0.0 if cfg.burst else r.arrival_s)
    start = time.monotonic()
    frag = Fragmentation(cfg.page_size)
    i = 0
    while i < len(order) or llm.has_work():
        now = time.monotonic() - start
        j = i
        if cfg.sequential:
            j += int(i < len(order) and not llm.has_work())
        else:
            while j < len(order) and (cfg.burst or order[j].arrival_s <= now):
                j += 1
        if j > i:
            due, i = order[i:j], j
            llm.add_requests([fit_vocab(r.tokens(), vocab).tolist() for r in due],
                             [SamplingParams(max_tokens=r.max_tokens, temperature=0.0, ignore_eos=True) for r in due])
        if llm.has_work():
            finished = llm.step()
            frag.observe(llm.core.scheduler, finished)
            if progress is not None and finished:
                progress(len(finished))
        elif i < len(order):
            time.sleep(min(max(order[i].arrival_s - now, 0.0), 0.05))
    llm.core.cache.evict(llm.core.pool.num_pages)
    return ReplayResult.build(ReplayMode.REAL, cfg, requests=len(requests), metrics=llm.core.scheduler.metrics,
                              pool=llm.core.pool, started=t0, clock_s=time.monotonic() - start,
                              output_tokens=sum(r.max_tokens for r in ok), rejected=rejected,
                              too_long=too_long, model_context=context, fragmentation=frag)
