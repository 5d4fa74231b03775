"""Host-tier planning (issue 37): how big the host KV tier is, and whether the machine can pin it. No torch.

The host tier is given either in bytes (`host_kv_cache_bytes`, `radixkv serve --host-kv-cache-gb N`) or,
SGLang's spelling, as a ratio of the GPU pool (`hicache_ratio`, `--hicache-ratio R`: host pages = R x GPU
pages). One host page holds exactly what one GPU page holds (every layer's K and V, scales included:
plan.kv_bytes_per_page), so host pages = bytes // bytes_per_page.

Refusals name the value: a negative, non-integer or non-numeric size, both spellings at once, and (at
engine start-up, `check_pinnable`) a size larger than the host memory available to pin (MemAvailable
in /proc/meminfo).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

# device memory one host-tier transfer stages its pages through (engine/host_kv.py); the engine reserves it
# beside a step's memory when a host tier is configured (kv_store.default_num_pages)
HOST_STAGING_BYTES = 256 << 20

GIB = 1 << 30


def check_host_tier(host_kv_cache_bytes: object, hicache_ratio: object) -> None:
    """ValueError/TypeError naming the bad value: bytes must be an int >= 0 (or None), the ratio a finite
    number > 0 (or None), and not both given."""
    b = host_kv_cache_bytes
    if b is not None and (isinstance(b, bool) or not isinstance(b, int)):
        raise TypeError(f"host_kv_cache_bytes must be an int number of bytes (or None), got {b!r}")
    if b is not None and b < 0:
        raise ValueError(f"host_kv_cache_bytes must be >= 0, got {b}")
    r = hicache_ratio
    if r is not None and (isinstance(r, bool) or not isinstance(r, (int, float))):
        raise TypeError(f"hicache_ratio must be a number (host pages per GPU page), got {r!r}")
    if r is not None and not (math.isfinite(r) and r > 0):
        raise ValueError(f"hicache_ratio must be a finite number > 0, got {r!r}")
    if b and r is not None:
        raise ValueError(f"give host_kv_cache_bytes ({b}) or hicache_ratio ({r}), not both")


def parse_gb(text: str, flag: str = "--host-kv-cache-gb") -> int:
    """A command-line size in GiB (a number >= 0, fractions allowed) as bytes; ValueError naming `flag`
    and the text otherwise."""
    try:
        gb = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"{flag} must be a number of GiB, got {text!r}") from None
    if not (math.isfinite(gb) and gb >= 0):
        raise ValueError(f"{flag} must be a number of GiB >= 0, got {text!r}")
    return int(gb * GIB)


def parse_ratio(text: str, flag: str = "--hicache-ratio") -> float:
    """A command-line host/GPU page ratio (a finite number > 0); ValueError naming `flag` and the text."""
    try:
        r = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"{flag} must be a number (host pages per GPU page), got {text!r}") from None
    if not (math.isfinite(r) and r > 0):
        raise ValueError(f"{flag} must be a number > 0, got {text!r}")
    return r


def host_pages(gpu_pages: int, bytes_per_page: int, host_kv_cache_bytes: int | None = None,
               hicache_ratio: float | None = None) -> int:
    """Pages of the host tier: bytes // bytes_per_page, or round(ratio x gpu_pages); 0 when neither is given."""
    check_host_tier(host_kv_cache_bytes, hicache_ratio)
    if bytes_per_page < 1:
        raise ValueError(f"bytes_per_page must be >= 1, got {bytes_per_page}")
    if hicache_ratio is not None:
        return int(round(hicache_ratio * gpu_pages))
    return (host_kv_cache_bytes or 0) // bytes_per_page


def mem_available(meminfo: str = "/proc/meminfo") -> int | None:
    """MemAvailable of the host in bytes, or None where the file or the line is missing (not Linux)."""
    try:
        with open(meminfo, encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_pinnable(nbytes: int, what: str, available: int | None = None) -> None:
    """ValueError naming `what` (the option as given, e.g. "host_kv_cache_bytes=...") when its `nbytes`
    exceed the host memory available to pin (`available`, default MemAvailable); unknown availability lets
    it through (pinning then fails on its own)."""
    avail = mem_available() if available is None else available
    if avail is not None and nbytes > avail:
        raise ValueError(f"{what}: a host KV tier of {nbytes} bytes ({nbytes / GIB:.1f} GiB) is more than this "
                         f"machine can pin: {avail} bytes ({avail / GIB:.1f} GiB) of host memory available "
                         f"(MemAvailable)")


@dataclass(frozen=True)
class HostTierPlan:
    """Both tiers of one KV dtype: GPU pages / tokens, host pages / tokens / bytes, and their sum."""

    gpu_pages: int
    gpu_tokens: int
    host_pages: int
    host_tokens: int
    host_kv_bytes: int  # host_pages x bytes_per_page (what is pinned)
    total_tokens: int

    def to_json(self) -> dict[str, int]:
        return {"host_max_pages": self.host_pages, "host_max_tokens": self.host_tokens,
                "host_kv_bytes": self.host_kv_bytes, "total_max_tokens": self.total_tokens}


def plan_host_tier(gpu_pages: int, page_size: int, bytes_per_page: int, host_kv_cache_bytes: int | None = None,
                   hicache_ratio: float | None = None) -> HostTierPlan:
    """The two tiers for a GPU pool of `gpu_pages` pages and a host tier given in bytes or as a ratio."""
    n = host_pages(gpu_pages, bytes_per_page, host_kv_cache_bytes, hicache_ratio)
    return HostTierPlan(gpu_pages, gpu_pages * page_size, n, n * page_size, n * bytes_per_page,
                        (gpu_pages + n) * page_size)
