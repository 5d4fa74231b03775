"""Cascade (shared-prefix) decode attention: plain paged_decode vs cascade_decode vs FlashInfer's cascade.

    python benchmarks/kernels/bench_cascade.py --json benchmarks/results/cascade_kernels.json   # H200, one call
    python benchmarks/kernels/bench_cascade.py --sweep      # also prefix-kernel tiles / splits at 256 x 4k
    python benchmarks/kernels/bench_cascade.py --smoke      # CPU interpreter, tiny shapes: checks this script

Shapes: every row of a batch (64, 256) shares one prefix (1k, 4k, 16k tokens) and has its own tokens
after it (64, 512), Llama-8B heads (32 q, 8 KV, head_dim 128, page 16), bf16 q over bf16 or fp8_e4m3
pages (KVStore's layout: head-major FP8 pages, float16 per-token scales). One decode layer's attention:
  plain    paged_decode over the whole page tables, its default dispatch and the engine's split rule
  cascade  cascade_decode: the shared-prefix kernel once for the group, decode over each row's own pages,
           the merge (three launches; the plan is built once a step, outside the timing); FP8 pages also
           with the prefix widened to fp16 copies first (widen_max_bytes: the engine's way), and FP8 suffixes
           also timed on the Triton decode kernel (suffix_us_triton) beside the Gluon one
  flashinfer MultiLevelCascadeAttentionWrapper, 2 levels (shared, unique), where `import flashinfer` works
Each timing is kernel_common.time_fn (median over CUDA-graph replays, L2 flushed before each). Outputs
are checked first: cascade against plain, and both against fp64 attention on two rows. Prints one line
per shape, then a table; --json writes the rows (batch, shared_tokens, private_tokens, kv_dtype,
attention_us_plain, attention_us_cascade, attention_speedup, flashinfer_us, and the launches' times).
"""
from __future__ import annotations

import argparse
import datetime
import itertools
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

BATCHES, SHARED, PRIVATE, KV_DTYPES = (64, 256), (1024, 4096, 16384), (64, 512), ("bf16", "fp8_e4m3")
SMOKE = {"batches": (3,), "shared": (48,), "private": (20,)}  # interpreter: one tiny shape per kv dtype
# The prefix kernel's tiles tried by --sweep: (block_m, block_n, num_warps, num_stages, max_registers)
SWEEP_CONFIGS = ((128, 64, 8, 3, None), (128, 32, 8, 3, None), (128, 64, 8, 3, 128), (64, 64, 4, 3, None),
                 (128, 64, 4, 2, None), (256, 64, 8, 2, None))


class Shape:
    """One benchmark shape on the device: pages, tables, q and the cascade plan."""

    def __init__(self, batch: int, shared: int, private: int, kv_dtype: str, dev: torch.device, gen: torch.Generator,
                 smoke: bool):
        from radixkv.kernels.cascade_plan import plan_cascade

        self.batch, self.shared, self.private, self.kv_dtype = batch, shared, private, kv_dtype
        act = torch.float16 if smoke else torch.bfloat16  # the interpreter mis-computes bf16 dots
        cache_dt = FP8.get(kv_dtype, act)
        # Row 0 of the pool is the shared run, rows 1.. each row's own tokens (pages shuffled together).
        kv = ragged_kv([shared] + [private] * batch, PAGE, cache_dt, 2, dev, gen)
        self.k, self.v, self.k_scale, self.v_scale = kv.k, kv.v, kv.k_scale, kv.v_scale
        run = kv.page_table[0, : shared // PAGE].tolist()
        own = kv.page_table[1:, : -(-private // PAGE)].tolist()
        self.tables = [run + pages for pages in own]
        self.lens = [shared + private] * batch
        self.page_table = torch.tensor(self.tables, dtype=torch.int32, device=dev)
        self.seq_lens = torch.tensor(self.lens, dtype=torch.int32, device=dev)
        self.plan = plan_cascade(self.tables, self.lens, [(range(batch), shared)], PAGE, dev)
        self.q = torch.randn(batch, HQ, D, device=dev, generator=gen).to(act)

    def scales(self) -> dict:
        return {"k_scale": self.k_scale, "v_scale": self.v_scale}

    def fp8(self) -> tuple[torch.Tensor, ...] | None:
        return None if self.k_scale is None else (self.k, self.v, self.k_scale, self.v_scale)


def plain_fn(s: Shape):
    from radixkv.kernels import paged_decode
    from radixkv.kernels.dispatch import (
        choose_num_splits,
        decode_warps_per_sm,
        sm_count,
    )

    warps = decode_warps_per_sm(s.q.dtype, s.k, s.v, s.k_scale, HQ // HKV, D)
    splits = choose_num_splits(s.batch, HKV, s.shared + s.private, sm_count(s.q.device), warps_per_sm=warps)
    return lambda: paged_decode(s.q, s.k, s.v, s.page_table, s.seq_lens, **s.scales(), num_splits=splits)


def cascade_fn(s: Shape, **kw):
    from radixkv.kernels.cascade import cascade_decode

    return lambda: cascade_decode(s.q, s.k, s.v, s.plan, **s.scales(), **kw)


def launch_fns(s: Shape) -> dict:
    """The three launches of cascade_decode, one by one (same splits), for the time breakdown."""
    from radixkv.kernels.cascade import cascade_prefix_attention, merge_attention_states, paged_decode_partial
    from radixkv.kernels.cascade_plan import suffix_num_splits

    g, p = s.plan.groups, s.plan
    prefix = (lambda: cascade_prefix_attention(s.q, s.k, s.v, g.prefix_pages, g.prefix_lens, g.group_start,
                                               g.group_rows, **s.scales(), max_group_rows=g.max_group_rows))
    splits = suffix_num_splits(s.q, s.k, s.v, s.k_scale, p)
    suffix = (lambda: paged_decode_partial(s.q, s.k, s.v, p.suffix_pages, p.suffix_lens, **s.scales(),
                                           num_splits=splits))
    (o_p, l_p), (o_s, l_s) = prefix(), suffix()
    fns = {"prefix": prefix, "suffix": suffix, "merge": lambda: merge_attention_states(o_p, l_p, o_s, l_s,
                                                                                       out_dtype=s.q.dtype),
           "prefix_splits": o_p.shape[2], "suffix_splits": o_s.shape[2]}
    if s.k_scale is not None:  # FP8 suffixes also on the Triton kernel (an explicit config), at its split rule
        from radixkv.kernels.dispatch import choose_num_splits, sm_count
        from radixkv.kernels.launch import KernelKind, default_config

        config = default_config(KernelKind.DECODE, s.q, s.k)
        n = choose_num_splits(s.batch, HKV, p.max_suffix_len, sm_count(s.q.device))
        fns["suffix_triton"] = lambda: paged_decode_partial(s.q, s.k, s.v, p.suffix_pages, p.suffix_lens,
                                                            **s.scales(), num_splits=n, config=config)
    return fns


def flashinfer_fn(fi, s: Shape, workspace: torch.Tensor):
    """MultiLevelCascadeAttentionWrapper over the same pages: level 0 the shared run (all rows), level 1
    each row's own pages. FP8 pages go in as FlashInfer's HND layout (KVStore's head-major memory order)
    without our per-token scales: a timing peer only."""
    dev = s.q.device
    hnd = s.k_scale is not None
    w = fi.MultiLevelCascadeAttentionWrapper(2, workspace, "HND" if hnd else "NHD")
    own = s.plan.suffix_pages[:, : -(-s.private // PAGE)]
    n_run = s.shared // PAGE
    i32 = {"dtype": torch.int32, "device": dev}
    last = ((s.private - 1) % PAGE) + 1
    w.plan([torch.tensor([0, s.batch], **i32), torch.arange(s.batch + 1, **i32)],
           [torch.tensor([0, n_run], **i32), torch.arange(s.batch + 1, **i32) * own.shape[1]],
           [s.plan.groups.prefix_pages[0, :n_run].contiguous(), own.flatten().contiguous()],
           [torch.tensor([PAGE], **i32), torch.full((s.batch,), last, **i32)],
           HQ, HKV, D, PAGE, q_data_type=s.q.dtype, kv_data_type=s.k.dtype)
    kv = (s.k.transpose(1, 2), s.v.transpose(1, 2)) if hnd else (s.k, s.v)  # HND: [P, Hkv, S, D], contiguous
    return lambda: w.run(s.q, kv)


def bench_shape(s: Shape, fi, workspace, smoke: bool) -> dict:
    sm = 1 / math.sqrt(D)
    pool = Pool(s.k, s.v, s.page_table, s.seq_lens)
    rows = [0, s.batch - 1]
    plain, cascade = plain_fn(s), cascade_fn(s)
    out_plain, out_cascade = plain(), cascade()
    err_vs_plain = rel_err(out_cascade, out_plain.double())
    err_plain = check_rows(out_plain, s.q, pool, rows, [1] * s.batch, sm, fp8=s.fp8())
    err_cascade = check_rows(out_cascade, s.q, pool, rows, [1] * s.batch, sm, fp8=s.fp8())
    t_plain, t_cascade = time_fn(plain, smoke), time_fn(cascade, smoke)
    parts = launch_fns(s)
    t_parts = {k: round(time_fn(parts[k], smoke).us, 2) for k in ("prefix", "suffix", "merge", "suffix_triton")
               if k in parts}
    wide_us = wide_err = None
    if s.k_scale is not None:  # FP8: the prefix over fp16 copies (the engine's default budget) vs in-kernel
        wide = cascade_fn(s, widen_max_bytes=None)
        wide_err = check_rows(wide(), s.q, pool, rows, [1] * s.batch, sm, fp8=s.fp8())
        wide_us = round(time_fn(wide, smoke).us, 2)
    fi_us, fi_err = None, None
    if fi is not None:
        try:
            f = flashinfer_fn(fi, s, workspace)
            out_fi = f()
            if s.k_scale is None:  # same values: FlashInfer's output is comparable
                fi_err = rel_err(out_fi, out_plain.double())
            fi_us = round(time_fn(f, smoke).us, 2)
        except Exception as exc:  # noqa: BLE001 (a peer that fails leaves its column empty)
            print(f"  flashinfer cascade failed ({s.kv_dtype}): {type(exc).__name__}: {str(exc)[:200]}")
    r = {"batch": s.batch, "shared_tokens": s.shared, "private_tokens": s.private, "kv_dtype": s.kv_dtype,
         "attention_us_plain": round(t_plain.us, 2), "attention_us_cascade": round(t_cascade.us, 2),
         "attention_speedup": round(t_plain.us / t_cascade.us, 3), "flashinfer_us": fi_us,
         "prefix_us": t_parts["prefix"], "suffix_us": t_parts["suffix"], "merge_us": t_parts["merge"],
         "suffix_us_triton": t_parts.get("suffix_triton"),
         "prefix_splits": parts["prefix_splits"], "suffix_splits": parts["suffix_splits"],
         "rel_err_cascade_vs_plain": err_vs_plain, "rel_err_plain": err_plain, "rel_err_cascade": err_cascade,
         "rel_err_flashinfer_vs_plain": fi_err, "attention_us_cascade_widened": wide_us,
         "rel_err_cascade_widened": wide_err, "timing": t_cascade.method}
    print(f"  {s.batch:4d} x ({s.shared:5d} shared + {s.private:3d}) {s.kv_dtype:9s} plain {t_plain.us:9.1f} us  "
          f"cascade {t_cascade.us:8.1f} us (prefix {t_parts['prefix']:.1f} x{parts['prefix_splits']}, suffix "
          f"{t_parts['suffix']:.1f} x{parts['suffix_splits']}, merge {t_parts['merge']:.1f})  "
          f"{r['attention_speedup']:6.2f}x  flashinfer {fi_us}  err vs plain {err_vs_plain:.1e} "
          f"(fp64: plain {err_plain:.1e}, cascade {err_cascade:.1e})"
          + (f"\n      FP8 prefix over fp16 copies: cascade {wide_us:8.1f} us (fp64 err {wide_err:.1e}); "
             f"suffix on the Triton kernel {t_parts['suffix_triton']:.1f} us" if wide_us else ""))
    return r


def sweep(dev, gen, smoke: bool) -> list[dict]:
    """The shared-prefix kernel alone at batch 256 x 4k (bf16 and fp8_e4m3 pages) over tiles and split counts."""
    from radixkv.kernels.cascade import cascade_prefix_attention
    from radixkv.kernels.launch import KernelConfig

    out = []
    for kv_dtype in KV_DTYPES:
        s = Shape(*((3, 48, 20) if smoke else (256, 4096, 64)), kv_dtype, dev, gen, smoke)
        g = s.plan.groups
        flops = 4 * s.batch * HQ * s.shared * D
        for cfg, splits in itertools.product(SWEEP_CONFIGS[:1] if smoke else SWEEP_CONFIGS,
                                             (1, 2) if smoke else (1, 2, 4, 8)):
            config = KernelConfig(*cfg[:4], max_registers=cfg[4])
            try:
                t = time_fn(lambda s=s, g=g, c=config, n=splits: cascade_prefix_attention(
                    s.q, s.k, s.v, g.prefix_pages, g.prefix_lens, g.group_start, g.group_rows, **s.scales(),
                    max_group_rows=g.max_group_rows, num_splits=n, config=c), smoke)
            except Exception as exc:  # noqa: BLE001 (e.g. out of shared memory)
                print(f"  sweep {kv_dtype} {cfg} splits {splits}: {type(exc).__name__}: {str(exc)[:120]}")
                continue
            out.append({"kv_dtype": kv_dtype, "config": list(cfg), "splits": splits, "us": round(t.us, 2),
                        "tflops": round(flops / t.us / 1e6, 1)})
            print(f"  sweep prefix {kv_dtype:9s} {cfg} splits {splits}: {t.us:8.1f} us "
                  f"{flops / t.us / 1e6:6.1f} TFLOP/s")
    return out


def print_table(rows: list[dict]) -> None:
    print("\ncascade decode attention, one layer (us, CUDA-graph replays, L2 flushed)")
    print(f"{'batch':>5s} {'shared':>6s} {'own':>4s} {'kv':>9s} {'plain':>9s} {'cascade':>9s} {'speedup':>8s} "
          f"{'flashinfer':>10s} {'vs FI':>6s}")
    for r in rows:
        fi = r["flashinfer_us"]
        vs = f"{fi / r['attention_us_cascade']:6.2f}" if fi else f"{'-':>6s}"
        print(f"{r['batch']:5d} {r['shared_tokens']:6d} {r['private_tokens']:4d} {r['kv_dtype']:>9s} "
              f"{r['attention_us_plain']:9.1f} {r['attention_us_cascade']:9.1f} {r['attention_speedup']:7.2f}x "
              f"{fi if fi else '-':>10} {vs}")
    target = [r for r in rows if (r["batch"], r["shared_tokens"]) == (256, 4096)]
    for r in target:  # issue 21's kernel target
        verdict = "met" if r["attention_speedup"] >= 5 else "NOT met"
        print(f"target (batch 256, 4k shared, {r['private_tokens']} own, {r['kv_dtype']}): attention >= 5x plain: "
              f"{r['attention_speedup']:.2f}x, {verdict}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None, metavar="OUT", help="write the rows here (a JSON list)")
    ap.add_argument("--smoke", action="store_true", help="CPU interpreter, tiny shapes (checks the script)")
    ap.add_argument("--batch", type=int, nargs="+", default=list(BATCHES))
    ap.add_argument("--shared", type=int, nargs="+", default=list(SHARED), help="shared prefix tokens")
    ap.add_argument("--private", type=int, nargs="+", default=list(PRIVATE), help="own tokens a row")
    ap.add_argument("--kv-dtype", nargs="+", default=list(KV_DTYPES), choices=list(KV_DTYPES))
    ap.add_argument("--no-flashinfer", action="store_true")
    ap.add_argument("--sweep", action="store_true", help="also sweep the prefix kernel's tiles and splits")
    args = ap.parse_args(argv)
    bad = [n for n in args.shared if n % PAGE or n <= 0]
    if bad:
        ap.error(f"--shared must be positive multiples of the page size {PAGE}, got {bad}")
    if min(args.batch) < 1 or min(args.private) < 1:
        ap.error("--batch and --private must be >= 1")
    if args.smoke:
        args.batch, args.shared, args.private = list(SMOKE["batches"]), list(SMOKE["shared"]), list(SMOKE["private"])
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    elif not torch.cuda.is_available():
        print("bench_cascade: needs a CUDA GPU (run with --smoke to check the script on the CPU interpreter)")
        return 2
    from kernel_peers import load_flashinfer

    fi = load_flashinfer(not args.no_flashinfer and not args.smoke)
    if fi is None and not args.no_flashinfer and not args.smoke:
        print("note: FlashInfer not importable: its column stays empty")
    dev = torch.device("cpu" if args.smoke else "cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    name = "cpu (interpreter smoke run, fp16 for bf16)" if args.smoke else torch.cuda.get_device_name(dev)
    print(f"device {name}; torch {torch.__version__}; flashinfer {getattr(fi, '__version__', None)}")
    workspace = torch.zeros(256 << 20, dtype=torch.uint8, device=dev) if fi is not None else None
    rows = []
    for kv_dtype in args.kv_dtype:
        for batch in args.batch:
            for shared in args.shared:
                for private in args.private:
                    rows.append(bench_shape(Shape(batch, shared, private, kv_dtype, dev, gen, args.smoke), fi,
                                            workspace, args.smoke))
                    if dev.type == "cuda":
                        torch.cuda.empty_cache()
                    if args.json:  # after every shape, so a run cut short still leaves its numbers
                        _save(args.json, rows)
    if args.sweep:
        sweep(dev, gen, args.smoke)
    print_table(rows)
    print(f"({datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}; {name})")
    return 0


def _save(path: str, rows: list[dict]) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
