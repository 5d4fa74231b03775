"""`radixkv plan MODEL`: KV memory plan: bytes per token, pages and requests that fit a GPU."""
from __future__ import annotations

import argparse
import json
from typing import Any

from radixkv.argtypes import positive_int
from radixkv.cli.common import KV_DTYPE_CHOICES, CliError, check_output, write_output


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
    m.add_argument("--json", metavar="OUT.json", help="also write the plan as JSON ('-' for stdout only)")
    m.set_defaults(run=_cmd_plan)


def _cmd_plan(a: argparse.Namespace) -> int:
    from radixkv import plan

    check_output("--json", None if a.json in (None, "-") else a.json)
    try:
        shape = plan.read_model_shape(a.model)
        gpu = plan.parse_bytes(a.gpu_memory) if a.gpu_memory else _visible_gpu_memory()
        p = plan.plan_memory(shape, gpu, a.gpu_memory_utilization, a.page_size, a.context, a.batch, a.dtype,
                             a.kv_dtype)
    except ValueError as e:
        raise CliError(str(e)) from None
    if a.json == "-":
        print(json.dumps(p.to_json(), indent=1))
        return 0
    print(plan.format_plan(p))
    if a.json:
        write_output("--json", a.json, json.dumps(p.to_json(), indent=1) + "\n")  # (/dev/full: one line)
    return 0


def _visible_gpu_memory() -> int:
    import torch

    if not torch.cuda.is_available():
        raise CliError("no GPU visible: give --gpu-memory (e.g. --gpu-memory 80GiB)")
    return torch.cuda.get_device_properties(0).total_memory
