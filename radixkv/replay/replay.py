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
from typing import Any, NamedTuple

import numpy as np

from radixkv.config import Policy, SchedulerConfig
from .cost_model import CostModel, StepShape
from radixkv.scheduler.metrics import TimelinePoint  # (now, hit_rate, pages_in_use)
from radixkv.cache.pages import PagePool
from radixkv.cache.radix_tree import RadixCache
from radixkv.request import Request
from radixkv.workloads.traces import TraceRequest

Progress = Callable[[int], None]  # called with the number of requests just finished


class ReplayMode(enum.Enum):
    SEQUENTIAL = "sequential"  # one request at a time, file order, exact hit rate
    SIMULATE = "simulate"  # arrivals at their timestamps (or all at 0), scheduler + cost model
    REAL = "real"  # the engine runs a model


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

    def __post_init__(self) -> None:
        if self.page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {self.page_size}")
        if self.num_pages is not None and self.num_pages < 1:
            raise ValueError(f"num_pages must be >= 1, got {self.num_pages}")
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if not isinstance(self.policy, Policy):
            raise TypeError(f"policy must be a Policy, got {self.policy!r}")


@dataclass
class ReplayResult:
    """Summary of one replay. The first twelve fields are DESIGN.md's `--json` keys."""

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
    rejected: int = 0  # requests larger than the whole pool (or the model's context): never run
    sim_seconds: float = 0.0  # clock at the last finish
    output_tokens: int = 0
    timeline: list[TimelinePoint] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["mode"] = self.mode.value
        d["timeline"] = [list(p) for p in self.timeline]
        return d


class WaitPercentiles(NamedTuple):
    p50: float
    p99: float
    max: float


def wait_percentiles(waits: Sequence[float]) -> WaitPercentiles:
    if len(waits) == 0:
        return WaitPercentiles(0.0, 0.0, 0.0)
    w = np.asarray(waits, dtype=np.float64)
    return WaitPercentiles(float(np.percentile(w, 50)), float(np.percentile(w, 99)), float(w.max()))


def unlimited_pages(requests: Sequence[TraceRequest], page_size: int, with_outputs: bool) -> int:
    """A pool size that never runs out: every page any request could ever hold, all at once
    (prompt pages, plus output pages when the outputs are cached too), plus one spare."""
    lengths = np.fromiter((r.num_prompt_tokens + (r.max_tokens if with_outputs else 0) for r in requests),
                          dtype=np.int64, count=len(requests))
    return int((-(-lengths // page_size)).sum()) + 1


class ServiceTime:
    """Seconds to serve one request alone under a CostModel (sequential replay's clock).

    One prefill step computes the uncached prompt tokens (at least one: the last prompt token
    is always computed), attending over the whole prompt; then `max_tokens - 1` decode steps,
    the j-th reading prompt + j tokens of KV. The model is linear, so the decode steps are
    priced as that many steps at their mean context, exactly.
    """

    def __init__(self, cost: CostModel) -> None:
        self.cost = cost

    def serve(self, prompt_tokens: int, hit_tokens: int, output_tokens: int) -> float:
        new = max(prompt_tokens - hit_tokens, 1)
        s = self.cost.seconds(StepShape(new, 0, prompt_tokens, new * prompt_tokens))
        steps = output_tokens - 1
        if steps > 0:
            s += steps * self.cost.seconds(StepShape(0, 1, prompt_tokens + output_tokens / 2, 0))
        return float(s)


class Served(NamedTuple):
    hit_tokens: int  # prompt tokens matched in the tree
    ran: bool  # False: the request needed more pages than the whole pool
    pages_in_use: int  # pool pages used while the request held its own (its peak)


class _SequentialServer:
    """The pool and tree of a sequential replay: one request's prompt at a time."""

    def __init__(self, num_pages: int, page_size: int) -> None:
        self.pool = PagePool(num_pages)
        self.cache = RadixCache(self.pool, page_size=page_size)
        self.page_size = page_size

    def serve(self, tokens: np.ndarray) -> Served:
        """Match, evict LRU leaves if short, allocate, insert the full blocks, release.

        A request needing more pages than the pool can give even
        after evicting everything else does not run: it evicts and inserts nothing.
        """
        ps, pool, cache = self.page_size, self.pool, self.cache
        n = len(tokens)
        m = cache.match(tokens)
        cache.lock(m)
        need = -(-n // ps) - len(m.pages)  # pages for the uncached rest (tail page included)
        if need > pool.num_free + cache.num_evictable_pages:
            cache.unlock(m)
            return Served(m.num_tokens, False, pool.num_used)
        if need > pool.num_free:
            cache.evict(need - pool.num_free)
        new = pool.alloc(need)
        full = n // ps
        cache.insert(tokens[:full * ps], m.pages + new[:full - len(m.pages)])
        in_use = pool.num_used
        cache.unlock(m)
        pool.decref(new)  # the request is done; the tree keeps its own references
        return Served(m.num_tokens, True, in_use)


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
    server = _SequentialServer(num_pages, ps)
    pool = server.pool
    service = ServiceTime(cost)
    prompt_tokens = hit_tokens = output_tokens = peak = rejected = 0
    clock = 0.0
    waits: list[float] = []
    timeline: list[TimelinePoint] = []
    for r in requests:
        tokens = r.tokens()  # int32 [L]
        hit, ran, in_use = server.serve(tokens)
        prompt_tokens += len(tokens)
        hit_tokens += hit
        if not ran:
            rejected += 1
        else:
            peak = max(peak, in_use)
            arrival = 0.0 if cfg.burst else r.arrival_s
            start = max(clock, arrival)
            clock = start + service.serve(len(tokens), hit, r.max_tokens)
            waits.append(start - arrival)
            output_tokens += r.max_tokens
            timeline.append(TimelinePoint(clock, hit_tokens / prompt_tokens, pool.num_used))
        if progress:
            progress(1)
    server.cache.evict(pool.num_pages)
    w = wait_percentiles(waits)
    return ReplayResult(
        requests=len(requests), completed=len(waits), prompt_tokens=prompt_tokens,
        hit_tokens=hit_tokens, hit_rate=hit_tokens / prompt_tokens if prompt_tokens else 0.0,
        peak_pages=peak, preemptions=0, wait_p50_s=w.p50, wait_p99_s=w.p99, wait_max_s=w.max,
        leaked_pages=pool.num_pages - pool.num_free, wall_s=time.perf_counter() - t0,
        mode=ReplayMode.SEQUENTIAL, page_size=ps, num_pages=num_pages, unlimited=cfg.num_pages is None,
        rejected=rejected, sim_seconds=clock, output_tokens=output_tokens, timeline=timeline)


def _fits(requests: Sequence[TraceRequest], page_size: int, num_pages: int | None,
          context: int | None = None) -> tuple[list[TraceRequest], int]:
    """Requests whose prompt + output fit the pool on their own (and the model's context, when
    given), and how many did not. `num_pages=None`: an unlimited pool."""
    def fits(r: TraceRequest) -> bool:
        total = r.num_prompt_tokens + r.max_tokens
        return ((num_pages is None or -(-total // page_size) <= num_pages)
                and (context is None or total <= context))

    ok = [r for r in requests if fits(r)]
    return ok, len(requests) - len(ok)


def _sched_config(cfg: ReplayConfig) -> SchedulerConfig:
    return SchedulerConfig(policy=cfg.policy, max_running=cfg.concurrency)


def replay_simulated(requests: Sequence[TraceRequest], cfg: ReplayConfig, cost: CostModel,
                     progress: Progress | None = None) -> ReplayResult:
    """Arrivals at their timestamps (all at 0 with `cfg.burst`) through Scheduler + RadixCache,
    the clock driven by `cost` (radixkv.replay.simulator). Prompts go in as int32 arrays."""
    from .simulator import simulate

    t0 = time.perf_counter()
    served, rejected = _fits(requests, cfg.page_size, cfg.num_pages)
    num_pages = cfg.num_pages if cfg.num_pages is not None else unlimited_pages(served, cfg.page_size, True)
    reqs = [Request(rid=i, prompt=r.tokens(), max_tokens=r.max_tokens, arrival_s=r.arrival_s)
            for i, r in enumerate(served)]
    done = [0]

    def on_done(completed: int) -> None:  # simulate() reports the running total
        if progress is not None:
            progress(completed - done[0])
        done[0] = completed

    sim = simulate(reqs, num_pages, cfg.page_size, _sched_config(cfg), cost, burst=cfg.burst, progress=on_done)
    if progress is not None and rejected:
        progress(rejected)
    return ReplayResult(
        requests=len(requests), completed=sim.completed, prompt_tokens=sim.prompt_tokens,
        hit_tokens=sim.hit_tokens, hit_rate=sim.hit_rate, peak_pages=sim.peak_pages,
        preemptions=sim.preemptions, wait_p50_s=sim.wait_p50_s, wait_p99_s=sim.wait_p99_s,
        wait_max_s=sim.wait_max_s, leaked_pages=sim.leaked_pages, wall_s=time.perf_counter() - t0,
        mode=ReplayMode.SIMULATE, page_size=cfg.page_size, num_pages=num_pages,
        unlimited=cfg.num_pages is None, rejected=rejected, sim_seconds=sim.sim_seconds,
        output_tokens=sum(len(o) for o in sim.outputs.values()), timeline=list(sim.timeline))


def run_replay(requests: Sequence[TraceRequest], cfg: ReplayConfig, *, model: str | None = None,
               cost: CostModel | None = None, progress: Progress | None = None) -> ReplayResult:
    """Replay: on the engine when `model` is given (real mode), else sequentially when
    `cfg.sequential`, else through the scheduler simulator. `cost` defaults to CostModel()."""
    if model is not None:
        return replay_real(requests, cfg, model, progress)
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


def replay_real(requests: Sequence[TraceRequest], cfg: ReplayConfig, model: str,
                progress: Progress | None = None) -> ReplayResult:
    """Run the trace on the engine; token ids are brought into the vocabulary by `fit_vocab`.

    Requests are added when their (wall-clock) arrival time comes, all at once with `cfg.burst`,
    or one at a time in file order, each after the previous finished, with `cfg.sequential`.
    Requests longer than the model's context or the pool are skipped and counted as rejected.
    Hit tokens, waits, peak pages and the timeline come from the engine's scheduler metrics
    (wall seconds).
    """
    from radixkv.engine.llm import LLM
    from radixkv.engine.sampling import SamplingParams

    t0 = time.perf_counter()
    llm = LLM(model, page_size=cfg.page_size, num_pages=cfg.num_pages, scheduler=_sched_config(cfg))
    vocab = llm.spec.vocab_size
    ok, rejected = _fits(requests, cfg.page_size, llm.num_pages, llm.spec.max_position)
    order = list(ok) if cfg.sequential else sorted(ok, key=lambda r: 0.0 if cfg.burst else r.arrival_s)
    start = time.monotonic()
    completed = i = 0
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
            completed += len(finished)
            if progress is not None and finished:
                progress(len(finished))
        elif i < len(order):
            time.sleep(min(max(order[i].arrival_s - now, 0.0), 0.05))
    llm.cache.evict(llm.pool.num_pages)
    m = llm.scheduler.metrics
    w = m.wait_stats()
    return ReplayResult(
        requests=len(requests), completed=completed, prompt_tokens=m.prompt_tokens, hit_tokens=m.hit_tokens,
        hit_rate=m.hit_rate, peak_pages=m.peak_pages, preemptions=m.preemptions, wait_p50_s=w.p50,
        wait_p99_s=w.p99, wait_max_s=w.max, leaked_pages=llm.pool.num_pages - llm.pool.num_free,
        wall_s=time.perf_counter() - t0, mode=ReplayMode.REAL, page_size=cfg.page_size,
        num_pages=llm.num_pages, unlimited=False, rejected=rejected, sim_seconds=time.monotonic() - start,
        output_tokens=sum(r.max_tokens for r in ok), timeline=list(m.timeline))
