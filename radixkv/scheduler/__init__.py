"""The scheduler: which requests run each step, over the prefix cache. No torch.

scheduler.py (Scheduler: queues, chunked prefill, the step; admission.py and page_holding.py its admission
and page lifetime, preemption included), policies.py (admission
order: fcfs, lpm, dfs-weight, with the starvation guard), metrics.py (hits, waits, pool occupancy).
"""
from __future__ import annotations

from typing import Any

from .metrics import SchedulerMetrics, TimelinePoint, WaitStats, wait_stats

__all__ = ["Scheduler", "SchedulerMetrics", "TimelinePoint", "WaitStats", "wait_stats"]


def __getattr__(name: str) -> Any:
    # Scheduler loads on first use: a sequential replay needs only the metrics (start-up time)
    if name == "Scheduler":
        from .scheduler import Scheduler

        return Scheduler
    raise AttributeError(f"module 'radixkv.scheduler' has no attribute {name!r}")
