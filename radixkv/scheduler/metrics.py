"""Scheduler metrics: prefix hits, preemptions, queueing delay, pool occupancy. No torch.

The scheduler owns one `SchedulerMetrics` and updates it as it admits, preempts and finishes
requests; the simulator and the engine read it at the end of a run.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np


class TimelinePoint(NamedTuple):
    """One step's state, recorded when the step's results come back (`Scheduler.update`)."""

    now: float  # clock at the end of the step (simulated or wall seconds)
    hit_rate: float  # hit_tokens / prompt_tokens of every request admitted so far
    pages_in_use: int  # pool pages not free (held by requests or by the cache)


class WaitStats(NamedTuple):
    """Queueing delay percentiles in seconds (0.0 when no request finished); see `wait_stats`."""

    p50: float
    p99: float
    max: float


def wait_stats(waits_s: Sequence[float]) -> WaitStats:
    """Median, 99th percentile (numpy's linear interpolation) and maximum of per-request waits
    in seconds; all 0.0 for an empty list. The one place queueing delay statistics are computed."""
    if len(waits_s) == 0:
        return WaitStats(0.0, 0.0, 0.0)
    w = np.asarray(waits_s, dtype=np.float64)
    return WaitStats(float(np.percentile(w, 50)), float(np.percentile(w, 99)), float(w.max()))


@dataclass
class SchedulerMetrics:
    """Counters of one scheduler run.

    prompt_tokens / hit_tokens: counted once per request, at its first admission
    (hit_tokens = prompt tokens served from the prefix cache, i.e. `Request.cached_tokens`;
    host_hit_tokens: those of them a host tier copied back to GPU pages before the admission).
    waits_s: per finished request, its total time in the waiting queue (first wait plus every
    wait after a preemption). peak_pages: most pool pages in use at the end of any step.
    timeline: one point per step; past `timeline_limit` points every other one is dropped (and
    from then on only every 2nd, 4th, ... step is kept), so a long-lived engine stays bounded.
    """

    prompt_tokens: int = 0
    hit_tokens: int = 0
    host_hit_tokens: int = 0  # of hit_tokens, those the host tier loaded back (the rest were on GPU pages)
    preemptions: int = 0
    completed: int = 0
    steps: int = 0
    peak_pages: int = 0
    waits_s: list[float] = field(default_factory=list)
    timeline: list[TimelinePoint] = field(default_factory=list)
    timeline_limit: int = 200_000
    _stride: int = 1  # record every _stride-th step

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def wait_stats(self) -> WaitStats:
        """`wait_stats(self.waits_s)`: queueing delay of the requests finished so far."""
        return wait_stats(self.waits_s)

    def record_step(self, now: float, pages_in_use: int) -> None:
        self.steps += 1
        if pages_in_use > self.peak_pages:
            self.peak_pages = pages_in_use
        if (self.steps - 1) % self._stride:  # keeps steps 1, 1 + stride, 1 + 2 * stride, ...
            return
        self.timeline.append(TimelinePoint(now, self.hit_rate, pages_in_use))
        if len(self.timeline) > self.timeline_limit:
            del self.timeline[1::2]
            self._stride *= 2
