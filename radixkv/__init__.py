"""radixkv: a prefix-caching KV runtime for LLM serving.

The control plane (PagePool, RadixCache, Scheduler) imports no torch; the engine
names (LLM, SamplingParams, ...) load torch on first use.
"""
from __future__ import annotations

import importlib
from typing import Any

from .config import CacheConfig, Policy, SchedulerConfig
from .pages import OutOfPages, PagePool
from .radix_tree import MatchResult, RadixCache

_LAZY = {
    "LLM": "radixkv.engine",
    "Session": "radixkv.engine",
    "SamplingParams": "radixkv.sampling",
    "RequestOutput": "radixkv.engine",
    "Scheduler": "radixkv.scheduler",
}

__all__ = ["CacheConfig", "MatchResult", "OutOfPages", "PagePool", "Policy", "RadixCache",
           "SchedulerConfig", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'radixkv' has no attribute {name!r}")
