"""The fused decode projections (kernels/decode_linear.py) against the unfused chain the model runs today,
Llama-3-8B shapes, batch rows 1 / 4 / 16 (or any up to 64), on the GPU:

    python benchmarks/kernels/bench_decode_linear.py --json OUT.json [--sweep]
    python benchmarks/kernels/bench_decode_linear.py --sweep --sweep-rows 64 --rows 32,64 --prenorm-only --json OUT
        (the tall chain, model.decode_rows_tall: 64-row tiles, splits over K)

Each projection of a layer, fused vs unfused (cuBLAS F.linear plus radixkv's elementwise kernels):
    qkv      qkv GEMM -> RoPE -> store_kv                 vs  decode_linear(norm, "rope", kv=pages)
    o        o GEMM -> rms_norm(residual add, next norm)  vs  decode_linear("residual")
    gate_up  gate/up GEMM -> SiLU-and-mul                 vs  decode_linear(norm, "silu_mul")
    down     down GEMM -> rms_norm(residual add, next norm) vs  decode_linear("residual")
(the unfused chain's norms ride on the residual adds, as model.py runs them: 9 kernels a layer besides
attention against the fused 4).
Timed as CUDA-graph replays of 32 calls cycling through enough weight copies (>= 4x L2) that every call
reads its weights from DRAM, as a decode step does. Each row: us a call, the weight bytes' share of the
streaming-read rate measured in the same run, kernels a call, and the fused output's largest difference
from the unfused chain's in units of the output's bf16 ulp (large near zero outputs), and each path's own
error against fp64 (max |out - exact| / mean |exact|). --sweep first tries tiles at --sweep-rows and times
the rest with the best per projection on that side of 16 rows (printed; GPU_TILES / TALL_TILES in
decode_linear_tiles.py take them).
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parents[1] / "engine"))
from decode_floor import read_bandwidth  # noqa: E402

from radixkv import kernels  # noqa: E402
from radixkv.kernels import decode_linear as dl  # noqa: E402
from radixkv.kernels import decode_linear_tiles as tiles  # noqa: E402
from radixkv.kernels.launch import KernelConfig  # noqa: E402

H, I, HQ, HKV, D = 4096, 14336, 32, 8, 128
EPS = 1e-5
CALLS = 32
L2_BYTES = 60 << 20
PROJ = {"qkv": ((HQ + 2 * HKV) * D, H), "o": (H, HQ * D), "gate_up": (2 * I, H), "down": (H, I)}
EPILOGUE = {"qkv": "rope", "o": "residual", "gate_up": "silu_mul", "down": "residual"}


class Case:
    """One projection's inputs at `m` rows, with `copies` weight copies to cycle through."""

    def __init__(self, proj: str, m: int, dev: torch.device) -> None:
        n, k = PROJ[proj]
        g = torch.Generator(device=dev).manual_seed(m)
        self.proj, self.m = proj, m
        copies = max(2, -(-4 * L2_BYTES // (n * k * 2)))
        self.w = [torch.randn(n, k, device=dev, generator=g, dtype=torch.bfloat16) / k ** 0.5 for _ in range(copies)]
        self.x = torch.randn(m, k, device=dev, generator=g, dtype=torch.bfloat16)
        self.ln = 1 + 0.1 * torch.randn(k, device=dev, generator=g, dtype=torch.bfloat16)
        self.xn, _ = kernels.rms_norm(self.x, self.ln, EPS)  # the unfused chain's input: normed before
        # the fused norm's input: x's sums of squares in parts, as the residual kernel before it leaves them
        self.ssq = self.x.float().pow(2).view(m, tiles.partials(k, dev), -1).sum(-1)
        self.ssq_out = torch.empty(m, tiles.partials(n, dev, m), device=dev)
        self.ln_next = 1 + 0.1 * torch.randn(n, device=dev, generator=g, dtype=torch.bfloat16)
        self.h = torch.randn(m, n, device=dev, generator=g, dtype=torch.bfloat16)
        pos = torch.arange(m, device=dev) * 37 + 511
        inv = 1.0 / (500000.0 ** (torch.arange(0, D, 2, device=dev).float() / D))
        emb = torch.cat([pos[:, None] * inv] * 2, -1)
        self.cos, self.sin = emb.cos().bfloat16()[:, None], emb.sin().bfloat16()[:, None]
        self.pages = [torch.zeros(64, 16, HKV, D, device=dev, dtype=torch.bfloat16) for _ in range(2)]
        self.slots = torch.randperm(64 * 16, device=dev)[:m].long()
        self.out = torch.empty(m, n // 2 if proj == "gate_up" else n, device=dev, dtype=torch.bfloat16)
        self.y = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
        # room for any tile the sweep tries: up to 8 shares, column tiles of 16, row tiles of 16
        self.scratch = tiles.SplitScratch(dev, 8 * m * n, -(-n // 16) * -(-m // 16))

    @property
    def weight_bytes(self) -> int:
        return self.w[0].numel() * 2

    def fused(self, i: int, cfg: KernelConfig | None = None, bk: int | None = None, prenorm: bool = False,
              split_k: int | None = None) -> torch.Tensor:
        """prenorm: the tall batches' chain (model.decode_rows_tall): qkv and gate_up read x normed
        beforehand (no norm prologue); o and down store y and rms_norm adds it and norms, as unfused."""
        w, p = self.w[i % len(self.w)], self.proj
        kw = dict(config=cfg, block_k=bk, split_k=split_k, scratch=self.scratch)
        x, norm = (self.xn, {}) if prenorm else (self.x, dict(norm=(self.ln, EPS), ssq=self.ssq))
        if p == "qkv":
            return dl.decode_linear(x, w, "rope", out=self.out, rope=(self.cos, self.sin), heads=(HQ, HKV, D),
                                    kv=(*self.pages, self.slots), **norm, **kw)
        if p == "gate_up":
            return dl.decode_linear(x, w, "silu_mul", out=self.out, **norm, **kw)
        if prenorm:
            kernels.rms_norm(dl.decode_linear(self.x, w, out=self.y, **kw), self.ln_next, EPS, self.out)
            return self.out
        # out: the residual stream; ssq_out: its sums of squares for the next norm
        return dl.decode_linear(self.x, w, "residual", out=self.out, ssq_out=self.ssq_out if cfg is None else None, **kw)

    def unfused(self, i: int) -> torch.Tensor:
        w, p = self.w[i % len(self.w)], self.proj
        if p == "qkv":
            qkv = F.linear(self.xn, w).view(self.m, HQ + 2 * HKV, D)
            kernels.apply_rope_(qkv[:, :HQ + HKV], self.cos, self.sin)
            kernels.store_kv(qkv[:, HQ:HQ + HKV], qkv[:, HQ + HKV:], *self.pages, self.slots)
            return qkv.view(self.m, -1)
        if p == "gate_up":
            return kernels.silu_and_mul(F.linear(self.xn, w), out=self.out)
        kernels.rms_norm(F.linear(self.x, w), self.ln_next, EPS, self.out)  # out += y, then the next norm
        return self.out


def graph_us(fn: Callable[[int], object], calls: int = CALLS, count: bool = True) -> tuple[float, float]:
    """(us a call, kernels a call) of `calls` calls captured in one CUDA graph, best of 5 replays; kernels
    counted by the profiler when `count` (else 0)."""
    from torch.profiler import ProfilerActivity, profile

    for i in range(2):
        fn(i)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn(0)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls):
            fn(i)
    g.replay()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        best = min(best, a.elapsed_time(b) * 1e3 / calls)
    if not count:
        return best, 0
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        g.replay()
        torch.cuda.synchronize()
    n = sum(1 for e in prof.events() if e.device_type.name == "CUDA")
    return best, round(n / calls, 1)


def ulps(case: Case, fused: Callable[[int], torch.Tensor]) -> float:
    """Largest |fused(0) - unfused| over the outputs (and the K/V pages for qkv), in bf16 ulps of the value."""
    residual = case.proj in ("o", "down")  # out is the residual stream: both start from the same h
    pages0 = [p.clone() for p in case.pages]
    if residual:
        case.out.copy_(case.h)
    want = case.unfused(0).float().clone()
    pages_want = [p.float().clone() for p in case.pages]
    for p, p0 in zip(case.pages, pages0):
        p.copy_(p0)
    if residual:
        case.out.copy_(case.h)
    got = fused(0).float()
    pairs = [(got, want)] + ([(p.float(), q) for p, q in zip(case.pages, pages_want)] if case.proj == "qkv" else [])
    if case.proj == "qkv":
        pairs[0] = (got[:, :HQ * D], want[:, :HQ * D])  # k and v went to the pages
    worst = 0.0
    for a, b in pairs:
        ulp = torch.clamp(b.abs(), min=2.0 ** -60).log2().floor().exp2() * 2.0 ** -7
        worst = max(worst, float(((a - b).abs() / ulp).max()))
    return worst


def fp64_error(case: Case, fn: Callable[[int], torch.Tensor]) -> float:
    """max |out - exact| / mean |exact| of fn(0)'s output (qkv: the rotated q heads), the exact value taken in
    fp64 from the same rounded inputs (the unfused chain's normed x): a measure of each path's own error,
    where ulps() measures how far the two paths are from each other."""
    p = case.proj
    residual = p in ("o", "down")
    if residual:
        case.out.copy_(case.h)
    got = fn(0).double()
    x = (case.x if residual else case.xn).double()
    y = x @ case.w[0].double().T  # [m, N_w]
    if residual:
        want = case.h.double() + y
    elif p == "gate_up":
        g, u = y.chunk(2, dim=-1)
        want = g * torch.sigmoid(g) * u
    else:
        q = y[:, :HQ * D].view(case.m, HQ, D)
        rot = torch.cat((-q[..., D // 2:], q[..., :D // 2]), dim=-1)
        want = (q * case.cos.double() + rot * case.sin.double()).reshape(case.m, -1)
        got = got[:, :HQ * D]
    return float((got - want).abs().max() / want.abs().mean())


def tall_space(proj: str) -> list[tuple[int, int, int, tuple[int, int], int]]:
    """(block_m, block_n, block_k, (warps, stages), split_k) tried for 17-64 rows."""
    bns = {"qkv": (32, 64), "gate_up": (64, 128)}.get(proj, (32, 64, 128))
    bks = (64, 128) if proj == "gate_up" else (128, 256)
    splits = {"qkv": (1, 2, 4), "gate_up": (1, 2)}.get(proj, (1, 2, 4, 8))
    return list(itertools.product((64,), bns, bks, ((4, 3), (8, 4)), splits))


def sweep(case: Case, prenorm: bool = False, splits: tuple[int, ...] = (1,)) -> tuple[KernelConfig, int, int, float]:
    """The fastest tile for this case: (config, block_k, split_k, us). Above 16 rows: one tile of 64 rows
    (tall_space's splits); up to 16, `splits` over K."""
    best = (None, 0, 1, float("inf"))
    if case.m <= tiles.SHORT_ROWS:
        space = itertools.product((16,), (16, 32), (128, 256, 512), ((4, 3), (4, 4), (8, 4), (4, 6)), splits)
    else:
        space = tall_space(case.proj)
    for bm, bn, bk, (warps, stages), split in space:
        cfg = KernelConfig(block_m=bm, block_n=bn, num_warps=warps, num_stages=stages)
        name = f"{case.proj} m={case.m} bn={bn} bk={bk} w={warps} s={stages} split={split}"
        try:
            us, _ = graph_us(lambda i: case.fused(i, cfg, bk, prenorm, split), calls=8, count=False)
        except Exception as e:  # shared memory over the limit
            print(f"#   {name}: {type(e).__name__}", flush=True)
            continue
        print(f"#   {name}: {us:.1f} us", flush=True)
        if us < best[3]:
            best = (cfg, bk, split, us)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--sweep", action="store_true", help="pick tiles per projection first (at --sweep-rows)")
    ap.add_argument("--sweep-rows", default="1,16", help="row counts the sweep tries tiles at (one tile shape each)")
    ap.add_argument("--rows", default="1,4,16")
    ap.add_argument("--prenorm", action="store_true",
                    help="also time the tall batches' chain: qkv and gate_up over x normed beforehand, o and down "
                         "storing y for rms_norm (model.decode_rows_tall)")
    ap.add_argument("--prenorm-only", action="store_true", help="time the tall batches' chain only")
    ap.add_argument("--short-splits", type=lambda v: tuple(int(s) for s in v.split(",")), default=(1,),
                    help="splits over K the sweep tries at 1-16 rows, e.g. 1,2,4")
    a = ap.parse_args()
    dev = torch.device("cuda")
    bw = read_bandwidth(dev, False)
    print(f"# streaming read {bw / 1e12:.2f} TB/s", flush=True)
    variants = [(proj, pre) for proj in PROJ for pre in ((True,) if a.prenorm_only else (False, True) if a.prenorm
                                                          else (False,))]
    # picks by (projection, prenorm, tall): a tile swept at 1-16 rows times 1-16 rows, one swept above at 17-64
    picked: dict[tuple[str, bool, bool], tuple[KernelConfig, int, int]] = {}
    if a.sweep:
        sweep_rows = [int(r) for r in a.sweep_rows.split(",")]
        for (proj, pre), tall in itertools.product(variants, (False, True)):
            side = [m for m in sweep_rows if (m > tiles.SHORT_ROWS) == tall]
            if not side:
                continue
            results = [sweep(Case(proj, m, dev), pre, a.short_splits) for m in side]
            cfg, bk, split, _ = min(results, key=lambda r: r[3])  # the fastest at any of the row counts tried
            picked[proj, pre, tall] = (cfg, bk, split)
            print(f"# {proj}{' prenorm' if pre else ''}: picked {cfg} block_k={bk} split_k={split} "
                  f"({[round(r[3], 1) for r in results]} us at {side} rows)", flush=True)
    rows = []
    for (proj, pre), m in itertools.product(variants, [int(r) for r in a.rows.split(",")]):
        case = Case(proj, m, dev)
        cfg, bk, split = picked.get((proj, pre, m > tiles.SHORT_ROWS), (None, None, None))
        fused = lambda i: case.fused(i, cfg, bk, pre, split)  # noqa: E731
        fused_us, fused_k = graph_us(fused)
        unfused_us, unfused_k = graph_us(case.unfused)
        row = dict(proj=proj, rows=m, prenorm=pre, fused_us=round(fused_us, 2), unfused_us=round(unfused_us, 2),
                   speedup=round(unfused_us / fused_us, 3),
                   fused_read_frac=round(case.weight_bytes / (fused_us * 1e-6) / bw, 3),
                   unfused_read_frac=round(case.weight_bytes / (unfused_us * 1e-6) / bw, 3),
                   fused_kernels=fused_k, unfused_kernels=unfused_k, max_ulps=round(ulps(case, fused), 1),
                   fused_err=float(f"{fp64_error(case, fused):.3g}"),
                   unfused_err=float(f"{fp64_error(case, case.unfused):.3g}"),
                   tile=None if cfg is None else
                   f"bm{cfg.block_m} bn{cfg.block_n} bk{bk} w{cfg.num_warps} s{cfg.num_stages} split{split}")
        rows.append(row)
        print(json.dumps(row), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1) + "\n")
    print(f"\n{'proj':12} {'rows':>4} {'fused us':>9} {'unfused us':>10} {'x':>6} {'read frac':>10} {'was':>6} "
          f"{'kernels':>8} {'ulps':>7} {'err fused/unfused':>18}")
    for r in rows:
        name = r['proj'] + (' pre' if r['prenorm'] else '')
        print(f"{name:12} {r['rows']:4d} {r['fused_us']:9.1f} {r['unfused_us']:10.1f} {r['speedup']:6.2f} "
              f"{r['fused_read_frac']:10.3f} {r['unfused_read_frac']:6.3f} {r['fused_kernels']:>3}/{r['unfused_kernels']:<4} "
              f"{r['max_ulps']:7.1f} {r['fused_err']:9.2e}/{r['unfused_err']:.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
