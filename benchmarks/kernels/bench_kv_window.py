"""The recent-token window (LLM(kv_window=N), radixkv/engine/kv_window.py) on the GPU: correctness of the
windowed attention front against its reference backend, then what the window costs a decode step.

1. Checks (PagedAttention with a KVWindow, Triton backend vs reference backend on the same pages and
   shadows): a prefill chunk, a mixed step (a chunk beside decode rows) and decode steps across a page
   boundary, over bf16, fp8_e4m3 and int4 pages at head_dim 128 (the INT4 and FP8 one-warp Gluon decode
   partials and the Hopper extend with its lse on the H200), relative error of each step's output.
2. Timing, one layer's attention (store + attend) of a decode step at B x ctx, Llama-3-8B's heads
   (32 q / 8 KV, head_dim 128), page 16: each KV dtype without a window and with one of 16, and bf16 pages
   without one; CUDA-graph replays (time_fn). The window comes with a sink of `--sink` first tokens (the
   engine's default for INT pages: 16; 0 for the window alone).

    python benchmarks/kernels/bench_kv_window.py [--shapes 64x16384,256x4096] [--window 16] [--sink 16] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_common import HKV, HQ, PAGE, D, rel_err, time_fn

from radixkv.batch import Batch
from radixkv.engine.attention import Backend, PagedAttention
from radixkv.engine.kv_store import KVStore
from radixkv.engine.kv_window import KVWindow
from radixkv.request import Request


def make_batch(tables: list[list[int]], prev: list[int], new: list[int], ps: int) -> Batch:
    """Rows computing tokens prev[b] .. prev[b] + new[b] over page tables (no model behind them)."""
    q_start, positions, slots, start = [], [], [], 0
    for table, p, n in zip(tables, prev, new):
        q_start.append(start)
        positions.extend(range(p, p + n))
        slots.extend(table[t // ps] * ps + t % ps for t in range(p, p + n))
        start += n
    seq_lens = [p + n for p, n in zip(prev, new)]
    reqs = [Request(rid=i, prompt=[1] * s, max_tokens=1) for i, s in enumerate(seq_lens)]
    return Batch(reqs, [0] * start, positions, q_start, list(new), seq_lens,
                 [t[: -(-s // ps)] for t, s in zip(tables, seq_lens)], slots, [True] * len(reqs), ps)


def fronts(kv_dtype: str, num_pages: int, rows: int, window: int, dev: torch.device,
           backends: tuple[Backend, ...], sink: int = 0) -> list[PagedAttention]:
    """One PagedAttention a backend, each over its own KVStore (and KVWindow when window > 0)."""
    out = []
    for backend in backends:
        kv = KVStore(1, num_pages, PAGE, HKV, D, kv_dtype, dev, torch.bfloat16)
        win = KVWindow(kv, window, rows, sink) if window else None
        out.append(PagedAttention(kv, HQ, D, D ** -0.5, backend=backend, window=win))
    return out


def checks(kv_dtype: str, window: int, sink: int, dev: torch.device, gen: torch.Generator) -> list[dict]:
    """Triton vs reference backend, step by step, from the same empty pages."""
    tri, ref = fronts(kv_dtype, 256, 4, window, dev, (Backend.TRITON, Backend.REFERENCE), sink)
    perm = torch.randperm(255, generator=gen).tolist()
    tables = [perm[i * 60:(i + 1) * 60] for i in range(4)]
    steps = [([0, 0, 0, 0], [700, 90, 33, 1]), ([700, 90, 33, 1], [1, 300, 1, 1])]
    steps += [([701 + i, 390 + i, 34 + i, 2 + i], [1, 1, 1, 1]) for i in range(20)]  # crosses pages
    out = []
    for i, (prev, new) in enumerate(steps):
        batch = make_batch(tables, prev, new, PAGE)
        T = sum(new)
        q = torch.randn(T, HQ, D, generator=gen, device="cpu").to(dev, torch.bfloat16)
        k = torch.randn(T, HKV, D, generator=gen, device="cpu").to(dev, torch.bfloat16)
        v = torch.randn(T, HKV, D, generator=gen, device="cpu").to(dev, torch.bfloat16)
        got, want = [], []
        for front, res in ((tri, got), (ref, want)):
            front.plan(batch)
            res.append(front.run(q, k, v, 0))
        err = rel_err(got[0].float(), want[0].float())
        if i < 3 or i == len(steps) - 1:
            out.append({"kv_dtype": kv_dtype, "window": window, "sink": sink, "step": i, "tokens": T,
                        "path": tri.current_plan.path.value, "rel_err": err})
        if not math.isfinite(err) or err > 2e-2:
            raise AssertionError(f"{kv_dtype} window {window} step {i}: relative error {err:.3g}")
    return out


def decode_us(kv_dtype: str, window: int, rows: int, ctx: int, dev: torch.device, gen: torch.Generator,
              sink: int = 0) -> float:
    """One layer's store + attention of a decode step, rows at ctx tokens each (random pages)."""
    pages_per_row = -(-ctx // PAGE)
    (front,) = fronts(kv_dtype, rows * pages_per_row + 1, rows, window, dev, (Backend.TRITON,), sink)
    kv = front.kv
    tables = [list(range(b * pages_per_row, (b + 1) * pages_per_row)) for b in range(rows)]
    from radixkv.kernels import store_kv

    slots = torch.arange(rows * pages_per_row * PAGE, device=dev)
    for part in slots.split(1 << 20):  # random K/V in every slot
        x = torch.randn(part.numel(), HKV, D, device=dev, dtype=torch.bfloat16)
        store_kv(x, x, kv.k_cache[0], kv.v_cache[0], part, *kv.scales(0))
    batch = make_batch(tables, [ctx - 1] * rows, [1] * rows, PAGE)
    if window:  # the shadows a running engine would hold: the pages of each row's last tokens, filled
        front.window.prepare(make_batch(tables, [ctx - window] * rows, [window - 1] * rows, PAGE))
    front.plan(batch)
    q = torch.randn(rows, HQ, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(rows, HKV, D, device=dev, dtype=torch.bfloat16)
    return time_fn(lambda: front.run(q, k, k, 0), False).us


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="64x16384,256x4096")
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--sink", type=int, default=16)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(0)
    rows = []
    for kv in ("bf16", "fp8_e4m3", "int4"):
        for r in checks(kv, args.window, args.sink, dev, gen):
            rows.append(r)
            print(f"check {kv:9s} window {args.window} + sink {args.sink} step {r['step']:2d} ({r['path']}, {r['tokens']} tokens): "
                  f"rel err {r['rel_err']:.2e}", flush=True)
    timings = []
    for shape in args.shapes.split(","):
        b, ctx = (int(x) for x in shape.split("x"))
        base = decode_us("bf16", 0, b, ctx, dev, gen)
        for kv in ("fp8_e4m3", "int4"):
            plain = decode_us(kv, 0, b, ctx, dev, gen)
            windowed = decode_us(kv, args.window, b, ctx, dev, gen, args.sink)
            timings.append({"shape": shape, "kv_dtype": kv, "bf16_us": base, "us": plain, "window_us": windowed})
            print(f"{shape} {kv}: {plain:.1f} us, window {args.window} + sink {args.sink}: {windowed:.1f} us "
                  f"(bf16 {base:.1f} us)",
                  flush=True)
    print(f"\n| B x ctx | KV | no window (us) | window {args.window} + sink {args.sink} (us) | window cost | "
          "vs bf16 (no / window) |")
    print("|---|---|---:|---:|---:|---:|")
    for t in timings:
        print(f"| {t['shape']} | {t['kv_dtype']} | {t['us']:.1f} | {t['window_us']:.1f} | "
              f"{t['window_us'] / t['us']:.3f}x | {t['bf16_us'] / t['us']:.2f}x / {t['bf16_us'] / t['window_us']:.2f}x |")
    if args.json:
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(dev), "checks": rows,
                                         "timings": timings}, indent=1) + "\n")


if __name__ == "__main__":
    main()
