"""The scheduler: which requests run each step, over the prefix cache. No torch.

scheduler.py (Scheduler: queues, admission, chunked prefill, preemption), policies.py (admission
order: fcfs, lpm, dfs-weight, with the starvation guard), metrics.py (hits, waits, pool occupancy).
"""
from .metrics import SchedulerMetrics, TimelinePoint, WaitStats, wait_stats
from .scheduler import Scheduler

__all__ = ["Scheduler", "SchedulerMetrics", "TimelinePoint", "WaitStats", "wait_stats"]
