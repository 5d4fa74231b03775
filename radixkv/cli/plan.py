"""`radixkv plan MODEL`: KV memory plan: bytes per token, pages and requests that fit a GPU."""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import Any

from radixkv.argtypes import positive_int
from radixkv.cli.common import KV_DTYPE_CHOICES, CliError, check_output, write_output
from radixkv.plan_host import HostTierPlan, plan_host_tier


def add_plan_parser(sub: Any) -> None:
    """Add `plan` to the subparsers; sets `run`."""
    m = sub.add_parser("plan", help="KV memory plan: bytes per token, pages and requests that fit a GPU",
                       description="KV bytes per token and page for each KV dtype (scales included), weight bytes, "
                                   "and for a GPU's memory: pages and tokens that fit, peak concurrent requests "
                                   "at --context tokens each, and whether --batch x --context fits. No torch "
                                   "is needed unless --gpu-memory is left to the visible GPU.")
    m.add_argument("model", metavar="MODEL", help="model folder, config.json, .gguf, or a hub id in the local cache")
    m.add_argument("--gpu-memory", metavar="SIZE", help="e.g. 80GiB, 141GB (default: the visible GPU's total)")
    m.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    m.add_argument("--kv-dtype", action="append", choices=[k for k in KV_DTYPE_CHOICES if k != "auto"],
                   help="a KV dtype to plan (repeatable; default: all)")
    m.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="weight dtype (default: the config's)")
    m.add_argument("--page-size", "--block-size", dest="page_size", type=positive_int, default=16)
    m.add_argument("--context", type=positive_int, default=4096, help="tokens per request at its peak")
    m.add_argument("--batch", type=positive_int, default=16, help="concurrent requests of the load to check")
    m.add_argument("--host-memory", metavar="SIZE",
                   help="a host KV tier of SIZE under the GPU pool (e.g. 100GiB; serve's --host-kv-cache-gb): "
                        "adds its pages and tokens per KV dtype")
    m.add_argument("--hicache-ratio", type=float, metavar="R",
                   help="the host tier as R host pages per GPU page (SGLang's spelling; instead of --host-memory)")
    m.add_argument("--json", metavar="OUT.json", help="also write the plan as JSON ('-' for stdout only)")
    m.set_defaults(run=_cmd_plan)


def _cmd_plan(a: argparse.Namespace) -> int:
    from radixkv import plan
    from radixkv.model_shape import read_model_shape

    check_output("--json", None if a.json in (None, "-") else a.json)
    try:
        shape = read_model_shape(a.model)
        gpu = plan.parse_bytes(a.gpu_memory) if a.gpu_memory else _visible_gpu_memory()
        p = plan.plan_memory(shape, gpu, a.gpu_memory_utilization, a.page_size, a.context, a.batch, a.dtype,
                             a.kv_dtype)
        host = host_tier_rows(p, plan.parse_bytes(a.host_memory) if a.host_memory else None, a.hicache_ratio)
    except (ValueError, TypeError) as e:
        raise CliError(str(e)) from None
    out = p.to_json()
    if host:
        out |= host[p.chosen.kv_dtype].to_json() | {"host_tier": {k: asdict(v) for k, v in host.items()}}
    if a.json == "-":
        print(json.dumps(out, indent=1))
        return 0
    print(plan.format_plan(p))
    if host:
        print("\n" + format_host_tier(host))
    if a.json:
        write_output("--json", a.json, json.dumps(out, indent=1) + "\n")  # (/dev/full: one line)
    return 0


def host_tier_rows(p: Any, host_bytes: int | None, ratio: float | None) -> dict[str, HostTierPlan]:
    """Both tiers for each KV dtype row of the plan `p` (radixkv.plan.MemoryPlan); {} without a host tier."""
    if host_bytes is None and ratio is None:
        return {}
    return {r.kv_dtype: plan_host_tier(r.pages, p.page_size, r.bytes_per_page, host_bytes, ratio) for r in p.rows}


def format_host_tier(rows: dict[str, HostTierPlan]) -> str:
    """The two-tier table printed under the plan."""
    lines = [f"{'kv dtype':<10}{'GPU tokens':>15}{'host pages':>13}{'host tokens':>15}{'host bytes':>14}"
             f"{'both tiers':>15}"]
    for kv, h in rows.items():
        lines.append(f"{kv:<10}{h.gpu_tokens:>15,}{h.host_pages:>13,}{h.host_tokens:>15,}"
                     f"{h.host_kv_bytes / 2**30:>10,.2f} GiB{h.total_tokens:>15,}")
    return "\n".join(lines)


def _visible_gpu_memory() -> int:
    import torch

    if not torch.cuda.is_available():
        raise CliError("no GPU visible: give --gpu-memory (e.g. --gpu-memory 80GiB)")
    return torch.cuda.get_device_properties(0).total_memory
