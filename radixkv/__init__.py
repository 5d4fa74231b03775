"""radixkv: a prefix-caching KV runtime for LLM serving.

The control plane (PagePool, RadixCache, Scheduler) imports no torch; the engine
names (LLM, SamplingParams, ...) load torch on first use.
"""
from __future__ import annotations

import importlib
from typing import Any

from .cache import MatchResult, OutOfPages, PagePool, RadixCache
from .config import Policy, SchedulerConfig

_LAZY = {
    "LLM": "radixkv.engine.llm",
    "Session": "radixkv.engine.session",
    "SamplingParams": "radixkv.sampling_params",
    "RequestOutput": "radixkv.request",
    "Scheduler": "radixkv.scheduler",
}

__all__ = ["MatchResult", "OutOfPages", "PagePool", "Policy", "RadixCache",
           "SchedulerConfig", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'radixkv' has no attribute {name!r}")
