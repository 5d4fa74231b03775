"""N simulated replicas behind a router: each its own Scheduler + RadixCache + PagePool. No torch.

One simulated clock per replica, all driven forward to each arrival before the router decides:

    for each request, in arrival order (all at 0 under burst):
        every replica steps until its clock reaches the arrival (an idle one jumps to it)
        the router receives every replica's KV events emitted so far (prefix router only)
        the router picks a replica from the request and every replica's ReplicaLoad
        that replica queues the request
    then every replica runs until its queue is empty; each cache is cleared and its leaks counted

Steps are priced by the cost model and sampled tokens are `fake_token(rid, position)`, as in the
single-replica simulator (simulator.py), so a request's tokens are the same whatever the router.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from radixkv.cache.events import QueuePublisher
from radixkv.cache.pages import PagePool
from radixkv.cache.radix_tree import RadixCache
from radixkv.config import SchedulerConfig
from radixkv.request import Request
from radixkv.scheduler.metrics import SchedulerMetrics
from radixkv.scheduler.scheduler import Scheduler
from radixkv.workloads.traces import TraceRequest
from .cost_model import CostModel, StepTimer
from .replay import Progress, ReplayConfig, ReplayMode, ReplayResult, RunningTotal, simulated_requests
from .router import ReplicaLoad, Router, RouterKind, make_router
from .simulator import check_requests, fake_token


class Replica:
    """One simulated server: pool, tree (publishing KV events when asked), scheduler, clock."""

    def __init__(self, index: int, num_pages: int, page_size: int, sched: SchedulerConfig, cost: StepTimer,
                 publish_events: bool) -> None:
        self.index = index
        self.events = QueuePublisher(data_parallel_rank=index) if publish_events else None
        self.pool = PagePool(num_pages)
        self.cache = RadixCache(self.pool, page_size=page_size, events=self.events)
        self.scheduler = Scheduler(self.pool, self.cache, sched, page_size)
        self.cost = cost
        self.clock = 0.0
        self.served = 0

    def load(self) -> ReplicaLoad:
        s = self.scheduler
        backlog = sum(len(e.prompt_arr) - min(e.req.num_computed, len(e.prompt_arr)) for e in s.waiting)
        backlog += sum(len(e.prompt_arr) - min(e.req.num_computed, len(e.prompt_arr)) for e in s.running)
        return ReplicaLoad(s.num_waiting, s.num_running, backlog, self.served)

    def add(self, req: Request) -> None:
        self.scheduler.add(req, req.arrival_s)
        self.served += 1

    def _step(self) -> bool:
        """One scheduler step on the simulated clock; False when nothing could be scheduled."""
        s = self.scheduler
        batch = s.schedule(self.clock)
        if batch is None:
            return False
        self.clock += self.cost.step_seconds(batch)
        tokens = [fake_token(r.rid, len(r.output)) if sample else None
                  for r, sample in zip(batch.requests, batch.sample)]
        s.update(batch, tokens, self.clock)
        return True

    def advance_to(self, t: float) -> None:
        """Step while there is work and the clock is before `t`; an idle replica's clock jumps to t."""
        while self.clock < t and self.scheduler.has_work() and self._step():
            pass
        self.clock = max(self.clock, t)

    def run_out(self) -> None:
        """Step until every queued request finished."""
        s = self.scheduler
        while s.has_work():
            if not self._step():
                raise RuntimeError(f"replica {self.index} stalled with {s.num_waiting} waiting and "
                                   f"{s.num_running} running requests")


@dataclass(frozen=True)
class ReplicaStats:
    """What one replica served."""

    requests: int  # routed to it
    completed: int
    prompt_tokens: int
    hit_tokens: int
    hit_rate: float
    peak_pages: int
    preemptions: int
    leaked_pages: int
    sim_seconds: float


@dataclass
class FleetResult:
    """A fleet replay: per-replica stats and their sum (`metrics`, as one scheduler's counters:
    tokens, completions and preemptions summed, waits of every request, peak = the largest
    replica's peak, no timeline)."""

    router: RouterKind
    replicas: list[ReplicaStats]
    metrics: SchedulerMetrics = field(repr=False)
    sim_seconds: float = 0.0
    output_tokens: int = 0

    @property
    def per_replica_hit_rate(self) -> list[float]:
        return [r.hit_rate for r in self.replicas]

    @property
    def load_max_over_mean(self) -> float:
        """Most requests served by one replica over the mean (1.0 is perfect balance)."""
        served = [r.requests for r in self.replicas]
        mean = sum(served) / len(served)
        return max(served) / mean if mean else 1.0

    @property
    def leaked_pages(self) -> int:
        return sum(r.leaked_pages for r in self.replicas)

    def json_keys(self) -> dict[str, object]:
        """The keys `radixkv replay --replicas N --json` adds to the replay's own."""
        return {"replicas": len(self.replicas), "router": self.router.value,
                "per_replica_hit_rate": self.per_replica_hit_rate, "load_max_over_mean": self.load_max_over_mean,
                "per_replica_requests": [r.requests for r in self.replicas]}


def simulate_fleet(requests: Sequence[Request], num_replicas: int, router: Router, num_pages: int, page_size: int,
                   sched: SchedulerConfig, cost: StepTimer, burst: bool = False,
                   progress: Callable[[int], None] | None = None) -> FleetResult:
    """Serve `requests` (distinct rids; each must fit one replica's pool of `num_pages`) on
    `num_replicas` replicas placed by `router` (module docstring). The given Request objects are
    copied, not modified. `progress` is called with the number of requests routed so far."""
    check_requests(requests, num_pages, page_size, "simulate_fleet()", "a replica's pool")
    wants_events = router.kind is RouterKind.PREFIX
    fleet = [Replica(i, num_pages, page_size, sched, cost, wants_events) for i in range(num_replicas)]
    arrivals = sorted((Request(r.rid, r.prompt, r.max_tokens, arrival_s=0.0 if burst else r.arrival_s,
                               namespace=r.namespace, stop_token_ids=r.stop_token_ids) for r in requests),
                      key=lambda r: r.arrival_s)  # stable: file order among equal times
    for n, req in enumerate(arrivals, 1):
        for rep in fleet:
            rep.advance_to(req.arrival_s)
            if rep.events is not None and len(rep.events):
                router.observe(rep.index, rep.events.drain(rep.clock))
        choice = router.route(req.prompt, req.namespace, [rep.load() for rep in fleet])
        if not 0 <= choice < num_replicas:
            raise RuntimeError(f"router {router.kind.value} chose replica {choice} of {num_replicas}")
        fleet[choice].add(req)
        if progress is not None:
            progress(n)
    merged = SchedulerMetrics()
    stats = []
    for rep in fleet:
        rep.run_out()
        rep.cache.evict(rep.cache.num_cached_pages)
        m = rep.scheduler.metrics
        stats.append(ReplicaStats(rep.served, m.completed, m.prompt_tokens, m.hit_tokens, m.hit_rate, m.peak_pages,
                                  m.preemptions, rep.pool.num_pages - rep.pool.num_free, rep.clock))
        merged.prompt_tokens += m.prompt_tokens
        merged.hit_tokens += m.hit_tokens
        merged.preemptions += m.preemptions
        merged.completed += m.completed
        merged.steps += m.steps
        merged.peak_pages = max(merged.peak_pages, m.peak_pages)
        merged.waits_s.extend(m.waits_s)
    return FleetResult(router.kind, stats, merged, sim_seconds=max(rep.clock for rep in fleet),
                       output_tokens=sum(len(r.output) for r in arrivals))


class FleetReplay(NamedTuple):
    result: ReplayResult  # the fleet as one replay: the `--json` keys (docs/replay.md) over every replica
    fleet: FleetResult  # per replica, and the fleet's own keys


def replay_fleet(requests: Sequence[TraceRequest], cfg: ReplayConfig, num_replicas: int, router: RouterKind,
                 cost: StepTimer | None = None, progress: Progress | None = None) -> FleetReplay:
    """A simulated replay (as `replay_simulated`) on `num_replicas` replicas of `cfg.num_pages` pages
    each (None: each unlimited) and `cfg.concurrency` running requests each, placed by `router`.

    The ReplayResult sums the replicas (hit_rate over every prompt token; peak_pages the largest
    replica's peak, against `num_pages`, one replica's pool; leaked_pages over all pools; no
    timeline, no fragmentation)."""
    if cfg.sequential:
        raise ValueError("a fleet replay is simulated: cfg.sequential must be False")
    t0 = time.perf_counter()
    reqs, rejected, num_pages = simulated_requests(requests, cfg)
    fleet = simulate_fleet(reqs, num_replicas, make_router(router, num_replicas, cfg.page_size), num_pages, cfg.page_size,
                           cfg.scheduler_config(), cost or CostModel(), burst=cfg.burst,
                           progress=None if progress is None else RunningTotal(progress))
    if progress is not None and rejected:
        progress(rejected)
    pool = PagePool(num_pages)  # stands for one replica's pool in the summary; leaks are replaced below
    result = ReplayResult.build(ReplayMode.SIMULATE, cfg, requests=len(requests), metrics=fleet.metrics, pool=pool,
                                started=t0, clock_s=fleet.sim_seconds, output_tokens=fleet.output_tokens,
                                rejected=rejected)
    return FleetReplay(replace(result, leaked_pages=fleet.leaked_pages), fleet)
