"""Two-level cascade decode: plain paged_decode vs one cascade level vs two (issue 21 item 1's outer rule).

    python benchmarks/kernels/bench_cascade_levels.py --json benchmarks/results/cascade_levels.json  # H200, ~1.5 min
    python benchmarks/kernels/bench_cascade_levels.py --smoke     # CPU interpreter, tiny shapes: checks this script

Shapes: `batch` rows share a system prompt (`outer` tokens) and are split evenly over `groups` few-shot
blocks (`inner` tokens each, after the system prompt), then have `own` tokens each; Llama-8B heads (32 q,
8 KV, head_dim 128, page 16), bf16 q over bf16 pages (--kv-dtype fp8_e4m3 adds FP8 pages). One decode
layer's attention:
  plain  paged_decode over the whole page tables (the engine's split rule)
  one    cascade_decode, one level: a group per block, its run = system prompt + block, read once a group
  two    cascade_decode, two levels: the system prompt once for all rows (the outer group), each block once
         after it, each row's own pages; one prefix launch more than `one` (the same single merge)
  outer  the two-level plan's outer prefix launch alone (what the extra level costs)
The outer level saves (groups - 1) x outer tokens of KV reads a layer; it pays where `two` < `one`.
cascade_groups.OUTER_RULE (CASCADE_OUTER_MIN_UNITS, CASCADE_OUTER_MIN_SHARED_TOKENS) is set from this table;
`one` vs `plain` at 16-row groups also bounds the one-level rule (CascadeRule's min rows). Timings are
kernel_common.time_fn (median over CUDA-graph replays, L2 flushed before each); plans are built outside
the timing. Outputs are checked first: one and two levels against plain, plain against fp64 on two rows.
Prints one line per shape, then the rule's verdict and a table (last); --json writes the rows.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_common import (
    FP8,
    HKV,
    HQ,
    PAGE,
    D,
    Pool,
    check_rows,
    ragged_kv,
    rel_err,
    time_fn,
)

BATCH, OUTER, GROUPS, INNER, OWN, KV_DTYPES = 256, (1024, 4096), (4, 16), (1024, 4096), 64, ("bf16",)
SMOKE = {"batch": 4, "outer": (32,), "groups": (2,), "inner": (32,), "own": 20}  # interpreter: one tiny shape


class Shape:
    """One shape on the device: pages, whole page tables, q and the one- and two-level plans."""

    def __init__(self, batch: int, outer: int, groups: int, inner: int, own: int, kv_dtype: str, dev: torch.device,
                 gen: torch.Generator, smoke: bool):
        from radixkv.kernels.cascade_plan import plan_cascade

        self.batch, self.outer, self.groups, self.inner, self.own = batch, outer, groups, inner, own
        self.kv_dtype = kv_dtype
        act = torch.float16 if smoke else torch.bfloat16  # the interpreter mis-computes bf16 dots
        # pool rows: 0 the system prompt, 1..groups the blocks, then each row's own tokens (pages shuffled)
        kv = ragged_kv([outer] + [inner] * groups + [own] * batch, PAGE, FP8.get(kv_dtype, act), 2, dev, gen)
        self.k, self.v, self.k_scale, self.v_scale = kv.k, kv.v, kv.k_scale, kv.v_scale
        table = kv.page_table.tolist()
        system = table[0][: outer // PAGE]
        blocks = [table[1 + g][: inner // PAGE] for g in range(groups)]
        member = [b * groups // batch for b in range(batch)]  # row b's block: contiguous runs of rows
        self.tables = [system + blocks[member[b]] + table[1 + groups + b][: -(-own // PAGE)] for b in range(batch)]
        self.lens = [outer + inner + own] * batch
        self.page_table = torch.tensor(self.tables, dtype=torch.int32, device=dev)  # [B, pages]
        self.seq_lens = torch.tensor(self.lens, dtype=torch.int32, device=dev)  # [B]
        inner_groups = [([b for b in range(batch) if member[b] == g], outer + inner) for g in range(groups)]
        self.one = plan_cascade(self.tables, self.lens, inner_groups, PAGE, dev)
        self.two = plan_cascade(self.tables, self.lens, inner_groups, PAGE, dev, outer=[(range(batch), outer)])
        self.q = torch.randn(batch, HQ, D, device=dev, generator=gen).to(act)  # [B, Hq, D]

    def scales(self) -> dict:
        return {"k_scale": self.k_scale, "v_scale": self.v_scale}

    def fp8(self) -> tuple[torch.Tensor, ...] | None:
        return None if self.k_scale is None else (self.k, self.v, self.k_scale, self.v_scale)


def fns(s: Shape) -> dict:
    """The timed calls: plain, one level, two levels, and the two-level plan's outer launch alone."""
    from radixkv.kernels import paged_decode
    from radixkv.kernels.cascade import cascade_decode, cascade_prefix_attention
    from radixkv.kernels.cascade_plan import default_prefix_splits
    from radixkv.kernels.dispatch import (
        choose_num_splits,
        decode_warps_per_sm,
        sm_count,
    )

    warps = decode_warps_per_sm(s.q.dtype, s.k, s.v, s.k_scale, HQ // HKV)
    splits = choose_num_splits(s.batch, HKV, s.lens[0], sm_count(s.q.device), warps_per_sm=warps)
    o = s.two.outer
    outer_splits = default_prefix_splits(s.q.dtype, s.k, HQ, 1, s.batch, s.outer)
    return {
        "plain": lambda: paged_decode(s.q, s.k, s.v, s.page_table, s.seq_lens, **s.scales(), num_splits=splits),
        "one": lambda: cascade_decode(s.q, s.k, s.v, s.one, **s.scales()),
        "two": lambda: cascade_decode(s.q, s.k, s.v, s.two, **s.scales(), outer_splits=outer_splits),
        "outer": lambda: cascade_prefix_attention(s.q, s.k, s.v, o.prefix_pages, o.prefix_lens, o.group_start,
                                                  o.group_rows, **s.scales(), max_group_rows=o.max_group_rows,
                                                  num_splits=outer_splits),
        "outer_splits": outer_splits,
    }


def bench_shape(s: Shape, smoke: bool) -> dict:
    from radixkv.scheduler.cascade_groups import OUTER_RULE

    f = fns(s)
    out = {k: f[k]() for k in ("plain", "one", "two")}
    err_one, err_two = (rel_err(out[k], out["plain"].double()) for k in ("one", "two"))
    pool = Pool(s.k, s.v, s.page_table, s.seq_lens)
    err_plain = check_rows(out["plain"], s.q, pool, [0, s.batch - 1], [1] * s.batch, 1 / math.sqrt(D), fp8=s.fp8())
    us = {k: round(time_fn(f[k], smoke).us, 2) for k in ("plain", "one", "two", "outer")}
    kv_bytes = s.k.element_size() * HKV * D * 2  # a token's K and V, one layer
    r = {"batch": s.batch, "outer_tokens": s.outer, "inner_groups": s.groups, "inner_tokens": s.inner,
         "own_tokens": s.own, "kv_dtype": s.kv_dtype, "rows_per_group": s.batch // s.groups,
         "us_plain": us["plain"], "us_one_level": us["one"], "us_two_levels": us["two"], "us_outer_launch": us["outer"],
         "speedup_one_vs_plain": round(us["plain"] / us["one"], 3),
         "speedup_two_vs_one": round(us["one"] / us["two"], 3),
         "speedup_two_vs_plain": round(us["plain"] / us["two"], 3),
         "saved_mib_two_vs_one": round((s.groups - 1) * s.outer * kv_bytes / 2**20, 1),
         "outer_splits": f["outer_splits"], "outer_rule_takes": OUTER_RULE.worth_it(s.groups, s.outer),
         "rel_err_one_vs_plain": err_one, "rel_err_two_vs_plain": err_two, "rel_err_plain": err_plain}
    print(f"  {s.batch} x ({s.outer:5d} + {s.groups:2d} x {s.inner:5d} + {s.own}) {s.kv_dtype:9s} plain "
          f"{us['plain']:8.1f} us  one {us['one']:8.1f}  two {us['two']:8.1f} (outer launch {us['outer']:.1f} "
          f"x{f['outer_splits']})  two/one {r['speedup_two_vs_one']:.2f}x  err one {err_one:.1e} two {err_two:.1e} "
          f"(plain vs fp64 {err_plain:.1e})")
    return r


def print_table(rows: list[dict]) -> None:
    from radixkv.scheduler.cascade_groups import (
        CASCADE_OUTER_MIN_SHARED_TOKENS,
        CASCADE_OUTER_MIN_UNITS,
    )

    wins = [r for r in rows if r["speedup_two_vs_one"] >= 1.03]
    print(f"\ncurrent outer rule: >= {CASCADE_OUTER_MIN_UNITS} units and >= {CASCADE_OUTER_MIN_SHARED_TOKENS} outer "
          f"tokens; two levels win (>= 3% over one) at {len(wins)} of {len(rows)} shapes: "
          + (", ".join(f"{r['inner_groups']} x {r['outer_tokens']}" for r in wins) or "none")
          + " (groups x outer tokens)")
    print("\ncascade levels, one decode layer's attention (us, CUDA-graph replays, L2 flushed)")
    print(f"{'rows':>4s} {'outer':>5s} {'groups':>6s} {'inner':>5s} {'own':>4s} {'kv':>9s} {'plain':>8s} {'one':>8s} "
          f"{'two':>8s} {'outer':>7s} {'one/pl':>7s} {'two/one':>7s} {'two/pl':>7s} {'saved':>8s} {'rule':>5s}")
    for r in rows:
        print(f"{r['batch']:4d} {r['outer_tokens']:5d} {r['inner_groups']:6d} {r['inner_tokens']:5d} "
              f"{r['own_tokens']:4d} {r['kv_dtype']:>9s} {r['us_plain']:8.1f} {r['us_one_level']:8.1f} "
              f"{r['us_two_levels']:8.1f} {r['us_outer_launch']:7.1f} {r['speedup_one_vs_plain']:6.2f}x "
              f"{r['speedup_two_vs_one']:6.2f}x {r['speedup_two_vs_plain']:6.2f}x {r['saved_mib_two_vs_one']:5.0f}MiB "
              f"{'two' if r['outer_rule_takes'] else 'one':>5s}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None, metavar="OUT", help="write the rows here (a JSON list)")
    ap.add_argument("--smoke", action="store_true", help="CPU interpreter, tiny shapes (checks the script)")
    ap.add_argument("--batch", type=int, default=BATCH)
    ap.add_argument("--outer", type=int, nargs="+", default=list(OUTER), help="system prompt tokens")
    ap.add_argument("--groups", type=int, nargs="+", default=list(GROUPS), help="few-shot blocks (inner groups)")
    ap.add_argument("--inner", type=int, nargs="+", default=list(INNER), help="tokens of each block")
    ap.add_argument("--own", type=int, default=OWN, help="own tokens a row")
    ap.add_argument("--kv-dtype", nargs="+", default=list(KV_DTYPES), choices=["bf16", *FP8])
    args = ap.parse_args(argv)
    bad = [n for n in args.outer + args.inner if n % PAGE or n <= 0]
    if bad:
        ap.error(f"--outer and --inner must be positive multiples of the page size {PAGE}, got {bad}")
    if args.own < 1 or min(args.groups) < 2 or args.batch < 2 * max(args.groups):
        ap.error("--own must be >= 1, --groups >= 2, and --batch at least 2 rows a group")
    if args.smoke:
        args.batch, args.outer, args.groups, args.inner, args.own = (SMOKE[k] for k in ("batch", "outer", "groups",
                                                                                         "inner", "own"))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    elif not torch.cuda.is_available():
        print("bench_cascade_levels: needs a CUDA GPU (run with --smoke to check the script on the CPU interpreter)")
        return 2
    dev = torch.device("cpu" if args.smoke else "cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    name = "cpu (interpreter smoke run, fp16 for bf16)" if args.smoke else torch.cuda.get_device_name(dev)
    print(f"device {name}; torch {torch.__version__}")
    rows = []
    for kv_dtype in args.kv_dtype:
        for outer in args.outer:
            for groups in args.groups:
                for inner in args.inner:
                    s = Shape(args.batch, outer, groups, inner, args.own, kv_dtype, dev, gen, args.smoke)
                    rows.append(bench_shape(s, args.smoke))
                    del s
                    if dev.type == "cuda":
                        torch.cuda.empty_cache()
                    if args.json:  # after every shape, so a run cut short still leaves its numbers
                        _save(args.json, rows)
    print(f"({datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}; {name})")
    print_table(rows)
    return 0


def _save(path: str, rows: list[dict]) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
