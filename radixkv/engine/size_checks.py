"""Sizes an engine cannot hold, refused before anything is allocated (issue 33 item 10).

`LLM(kv_dtype="int4", kv_window=10**9)`, `kv_sink=10**6`, `num_pages=2**40` or `page_size=10**6` once ended
in the allocator (`RuntimeError: can't allocate memory`, or CUDA out of memory) after minutes of loading.
`check_sizes` (ModelRunner.__init__ calls it before the KV store is built) raises a ValueError naming the
argument instead: page ids are int32, a page holds at most 2**16 tokens, a recent-token window or sink is no
longer than the model's context, and one page and the pool given must fit the device's memory (its total:
what is free is the pool sizing's business, and a size that merely exceeds what is free still ends as out of
memory).
"""
from __future__ import annotations

import os

import torch

from radixkv import plan
from radixkv.config import EngineConfig, KVDtype

from .model_config import ModelSpec

MAX_PAGES = 2**31 - 1  # page ids are int32 (PagePool)
MAX_PAGE_SIZE = 1 << 16  # tokens a page: far past any use (vLLM offers 1 to 256)


def device_memory(device: torch.device) -> int | None:
    """Bytes the device holds in all: the GPU's total memory, the host's physical memory for the CPU;
    None when it cannot be told."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB"


def check_sizes(cfg: EngineConfig, spec: ModelSpec, dtype: torch.dtype, device: torch.device,
                world: int = 1) -> None:
    """ValueError naming num_pages, page_size, kv_window or kv_sink when the KV store they ask for cannot
    exist on `device` (this rank's share of the KV heads with `world` tensor-parallel ranks)."""
    ps = cfg.page_size
    if ps > MAX_PAGE_SIZE:
        raise ValueError(f"page_size={ps:,} is more than {MAX_PAGE_SIZE:,} tokens a page (2**16; 16 to 256 is usual)")
    if cfg.num_pages is not None and cfg.num_pages > MAX_PAGES:
        raise ValueError(f"num_pages={cfg.num_pages:,} is more than {MAX_PAGES:,} (2**31 - 1: page ids are int32)")
    context = spec.max_position  # the most tokens a sequence may hold
    for name, value in (("kv_window", cfg.kv_window), ("kv_sink", cfg.kv_sink)):
        if value is not None and value > context:
            raise ValueError(f"{name}={value:,} is longer than the model's context ({context:,} tokens): "
                             f"give at most {context:,}")
    memory = device_memory(device)
    if memory is None:
        return
    kv_dtype = (KVDtype.for_compute(str(dtype).removeprefix("torch.")) if cfg.kv_dtype == "auto"
                else KVDtype(cfg.kv_dtype))
    kv_heads = -(-spec.num_kv_heads // world)
    per_page = plan.kv_bytes_per_page(ps, spec.num_layers, kv_heads, spec.head_dim, kv_dtype)
    where = f"the {device.type} device's {_gib(memory)}"
    if per_page > memory:
        raise ValueError(f"page_size={ps:,}: one KV page would take {_gib(per_page)}, more than {where}")
    if cfg.num_pages is not None and cfg.num_pages * per_page > memory:
        raise ValueError(f"num_pages={cfg.num_pages:,}: {cfg.num_pages:,} KV pages of {per_page:,} bytes would take "
                         f"{_gib(cfg.num_pages * per_page)}, more than {where}")
