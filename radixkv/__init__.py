"""radixkv: a prefix-caching KV runtime for LLM serving.

The control plane (PagePool, RadixCache, Scheduler) imports no torch; the engine
names (LLM, SamplingParams, ...) load torch on first use.
"""
from __future__ import annotations

import importlib
from typing import Any

from .cache import MatchResult, OutOfPages, PagePool, RadixCache
from .config import Policy, SchedulerConfig


def _version() -> str:
    """The installed package's version; in a source tree that is not installed, pyproject.toml's."""
    from importlib import metadata

    try:
        return metadata.version("radixkv")
    except metadata.PackageNotFoundError:
        import os
        import re

        path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pyproject.toml")
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError:
            return "0+unknown"
        # [project]'s `version = "..."` (tomllib is 3.11+; requires-python is 3.10)
        project = re.search(r"^\[project\]\s*$(.*?)(?=^\[|\Z)", text, re.M | re.S)
        found = project and re.search(r'^version\s*=\s*["\']([^"\']+)["\']', project.group(1), re.M)
        return found.group(1) if found else "0+unknown"


__version__ = _version()

_LAZY = {
    "LLM": "radixkv.engine.llm",
    "Session": "radixkv.engine.session",
    "SamplingParams": "radixkv.sampling_params",
    "RequestOutput": "radixkv.request",
    "CompletionOutput": "radixkv.request",
    "Logprob": "radixkv.request",
    "EngineArgs": "radixkv.engine_args",
    "Scheduler": "radixkv.scheduler",
}

__all__ = ["__version__", "MatchResult", "OutOfPages", "PagePool", "Policy", "RadixCache",
           "SchedulerConfig", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'radixkv' has no attribute {name!r}")
