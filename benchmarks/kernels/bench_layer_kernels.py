"""Fused layer kernels (rms_norm, silu_and_mul, apply_rope_, rope_store_kv_) on the GPU vs eager and torch.compile.

    python benchmarks/kernels/bench_layer_kernels.py --json benchmarks/results/layer_kernels.json   # H200, one call
    python benchmarks/kernels/bench_layer_kernels.py --smoke     # CPU interpreter, tiny shapes: checks this script

Llama-3-8B shapes (hidden 4096, 32 q / 8 KV heads, head_dim 128, intermediate 14336) at T = 1, 64, 256
tokens, bf16. Phase (1) checks each kernel against its twin in kernels/reference_layers.py (the engine's
eager math today) in bf16, fp16 and fp32: how many elements differ and by how much. RoPE (alone and with
the K/V store) and the residual sum must be bit-identical; silu_and_mul is expected to be (libdevice's expf,
contracted as nvcc compiles torch's silu), and is also run with FMA contraction off to show which build matches;
rms_norm differs in the fp32 sum's order only. Phase (2) times the kernel, the eager twin and
torch.compile(twin) (mode default) with kernel_common.time_fn: median of CUDA-graph replays, L2
flushed before each. A torch.compile failure is printed and its column left empty. The last table
sums a Llama decode step's share: 32 layers x (2 add+norm, rope, silu_and_mul).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from typing import Callable, NamedTuple

import torch

from kernel_common import time_fn

FULL = dict(hidden=4096, hq=32, hkv=8, d=128, inter=14336, tokens=(1, 64, 256), layers=32)
SMOKE = dict(hidden=64, hq=4, hkv=2, d=16, inter=96, tokens=(1, 3), layers=32)
EPS = 1e-5
STEP_OPS = {"add_rms_norm": 2, "rope": 1, "silu_and_mul": 1}  # a decoder layer's share, per step


class Case(NamedTuple):
    """One op at one shape: `kernel()` and `twin()` each return the tensors the op writes; they run
    on separate copies of the inputs, so a call may mutate its own."""

    kernel: Callable[[], tuple]
    twin: Callable[[], tuple]
    twin_fn: Callable  # reference function, for torch.compile
    twin_args: Callable[[], tuple]


def make_case(op: str, T: int, s: dict, dtype: torch.dtype, dev: torch.device, gen: torch.Generator,
              ops, ref) -> Case:
    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, device=dev, generator=gen) * scale).to(dtype)

    if op in ("rms_norm", "add_rms_norm"):
        x, res, w = rnd(T, s["hidden"]), rnd(T, s["hidden"], scale=4), (rnd(s["hidden"]) * 0.1 + 1).to(dtype)
        resid = op == "add_rms_norm"
        mine, theirs = res.clone(), res.clone()
        return Case(lambda: ops.rms_norm(x, w, EPS, mine if resid else None),
                    lambda: ref.rms_norm_ref(x, w, EPS, theirs if resid else None),
                    ref.rms_norm_ref, lambda: (x, w, EPS, theirs if resid else None))
    if op == "qk_norm":  # Qwen3: q/k heads of the fused qkv output, one weight row per head
        nh = s["hq"] + s["hkv"]
        qkv, w = rnd(T, nh + s["hkv"], s["d"]), (rnd(nh, s["d"]) * 0.1 + 1).to(dtype)
        return Case(lambda: ops.rms_norm(qkv[:, :nh], w, EPS), lambda: ref.rms_norm_ref(qkv[:, :nh], w, EPS),
                    ref.rms_norm_ref, lambda: (qkv[:, :nh], w, EPS))
    if op == "silu_and_mul":
        gu = rnd(T, 2 * s["inter"], scale=3)
        return Case(lambda: (ops.silu_and_mul(gu),), lambda: (ref.silu_and_mul_ref(gu),),
                    ref.silu_and_mul_ref, lambda: (gu,))
    if op == "silu_no_fma":  # the same kernel compiled with FMA contraction off (phase 1 only)
        gu = rnd(T, 2 * s["inter"], scale=3)
        return Case(lambda: (silu_without_fma(gu),), lambda: (ref.silu_and_mul_ref(gu),), ref.silu_and_mul_ref,
                    lambda: (gu,))
    if op == "rope":
        nh, d = s["hq"] + s["hkv"], s["d"]
        qkv = rnd(T, nh + s["hkv"], d, scale=2)
        pos = torch.randint(0, 8192, (T,), device=dev, generator=gen).float()
        inv = 1.0 / (500000.0 ** (torch.arange(0, d, 2, device=dev).float() / d))
        emb = torch.cat([pos[:, None] * inv[None, :]] * 2, dim=-1)
        cos, sin = emb.cos().to(dtype)[:, None, :], emb.sin().to(dtype)[:, None, :]  # model.py's [T, 1, D]
        mine, theirs = qkv.clone(), qkv.clone()
        return Case(lambda: (ops.apply_rope_(mine[:, :nh], cos, sin), mine),
                    lambda: (ref.apply_rope_ref(theirs[:, :nh], cos, sin), theirs),
                    ref.apply_rope_ref, lambda: (theirs[:, :nh], cos, sin))
    if op == "rope_store":  # RoPE with the K/V store into pages of 16 (rope_store.py), vs its twin
        hq, hkv, d = s["hq"], s["hkv"], s["d"]
        qkv = rnd(T, hq + 2 * hkv, d, scale=2)
        cos, sin = make_case("rope", T, s, dtype, dev, gen, ops, ref).twin_args()[1:]
        pages = torch.zeros(2, (2 * T + 15) // 16, 16, hkv, d, dtype=dtype, device=dev)  # [k | v, P, S, Hkv, D]
        slots = torch.randperm(2 * T, device=dev, generator=gen)[:T]
        mine, theirs = (qkv.clone(), pages.clone()), (qkv.clone(), pages.clone())
        return Case(lambda: (ops.rope_store_kv_(mine[0], cos, sin, hq, *mine[1], slots), mine[1]),
                    lambda: (ref.rope_store_kv_ref(theirs[0], cos, sin, hq, *theirs[1], slots), theirs[1]),
                    ref.rope_store_kv_ref, lambda: (theirs[0], cos, sin, hq, *theirs[1], slots))
    raise ValueError(op)


def silu_without_fma(gu: torch.Tensor) -> torch.Tensor:
    import triton

    from radixkv.kernels import activation as act

    T, i = gu.shape[0], gu.shape[1] // 2
    out = torch.empty(T, i, dtype=gu.dtype, device=gu.device)
    cfg = act._config(i)
    act._silu_mul_kernel[(T, triton.cdiv(i, cfg.block_n))](gu, out, gu.stride(0), out.stride(0), I=i, BLOCK=cfg.block_n,
                                                   LIBDEVICE=True, **{**act._options(cfg, gu.device),
                                                                      "enable_fp_fusion": False})
    return out


# ----------------------------------------------------------------------------- (1) correctness
def compare(a: tuple, b: tuple) -> dict:
    """Elements that differ (NaN-aware) over every output tensor, the largest |difference| and the
    largest |difference| / |twin's value| (an ulp is at most eps of the value)."""
    diff, n, worst, rel = 0, 0, 0.0, 0.0
    for x, y in zip(a, b):
        if x is None or x.numel() == 0:
            continue
        x, y = x.double(), y.double()
        same = (x == y) | (x.isnan() & y.isnan())
        d = torch.where(same, torch.zeros_like(x), (x - y).abs())
        diff += int((~same).sum())
        n += x.numel()
        worst = max(worst, float(d.max()))
        rel = max(rel, float((d / y.abs().clamp_min(1e-30)).max()))
    return {"differ": diff, "numel": n, "max_abs": worst, "max_rel": rel}


def correctness(ops, ref, s, dev, gen, smoke) -> list[dict]:
    exact = {"rope", "rope_store", "add_rms_norm:residual"} | (set() if smoke else {"silu_and_mul"})
    dtypes = (torch.float32, torch.float16) if smoke else (torch.bfloat16, torch.float16, torch.float32)
    names = ["rms_norm", "add_rms_norm", "qk_norm", "silu_and_mul", "rope", "rope_store"]
    names += [] if smoke else ["silu_no_fma"]
    rows = []
    for dtype in dtypes:
        for op in names:
            for T in s["tokens"]:
                c = make_case(op, T, s, dtype, dev, gen, ops, ref)
                got, want = c.kernel(), c.twin()
                parts = {op: compare(got, want)}
                if op == "add_rms_norm":
                    parts = {op: compare(got[:1], want[:1]), op + ":residual": compare(got[1:], want[1:])}
                for name, r in parts.items():
                    claim = name in exact
                    ok = r["differ"] == 0 if claim else r["max_rel"] <= 8 * torch.finfo(dtype).eps  # a few ulps
                    rows.append({"op": name, "dtype": str(dtype).replace("torch.", ""), "tokens": T,
                                 "claim": "bit-exact" if claim else "close", "ok": ok, **r})
                    print(f"  check {name:22s} {rows[-1]['dtype']:8s} T={T:4d}: {r['differ']:8d} / {r['numel']:9d} "
                          f"differ, max |d| {r['max_abs']:.2e} rel {r['max_rel']:.2e}  [{rows[-1]['claim']}: {'ok' if ok else 'FAIL'}]",
                          flush=True)
    return rows


# ----------------------------------------------------------------------------- (2) timings
def timings(ops, ref, s, dev, gen, smoke, use_compile) -> list[dict]:
    rows = []
    compiled = {}
    for op in ("rms_norm", "add_rms_norm", "qk_norm", "silu_and_mul", "rope", "rope_store"):
        for T in s["tokens"]:
            c = make_case(op, T, s, torch.float16 if smoke else torch.bfloat16, dev, gen, ops, ref)
            row = {"op": op, "tokens": T, "fused_us": time_fn(c.kernel, smoke).us, "eager_us": time_fn(c.twin, smoke).us,
                   "compile_us": None}
            if use_compile:
                try:
                    if op not in compiled:
                        compiled[op] = torch.compile(c.twin_fn)
                    fn = compiled[op]
                    args = c.twin_args()
                    fn(*args)  # compile outside the timing (smoke runs time one call)
                    row["compile_us"] = time_fn(lambda: fn(*args), smoke).us
                except Exception as exc:  # report, keep going
                    row["compile_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                    print(f"  torch.compile({op}) failed at T={T}: {row['compile_error']}", flush=True)
            rows.append(row)
            cu = f"{row['compile_us']:9.1f}" if row["compile_us"] is not None else f"{'-':>9s}"
            print(f"  time {op:14s} T={T:4d}: fused {row['fused_us']:9.1f} us  eager {row['eager_us']:9.1f} us  "
                  f"compile {cu} us", flush=True)
    return rows


def print_tables(rows: list[dict], s: dict) -> None:
    print("\nus per call (median); x = time / fused")
    print(f"{'op':>14s} {'T':>5s} {'fused':>9s} {'eager':>9s} {'compile':>9s} {'eager x':>8s} {'compile x':>9s}")
    for r in rows:
        cu = r["compile_us"]
        print(f"{r['op']:>14s} {r['tokens']:5d} {r['fused_us']:9.1f} {r['eager_us']:9.1f} "
              + (f"{cu:9.1f} {r['eager_us'] / r['fused_us']:8.2f} {cu / r['fused_us']:9.2f}" if cu is not None
                 else f"{'-':>9s} {r['eager_us'] / r['fused_us']:8.2f} {'-':>9s}"))
    print(f"\na decode step's share: {s['layers']} layers x (2 add_rms_norm + rope + silu_and_mul), us")
    for T in s["tokens"]:
        by = {r["op"]: r for r in rows if r["tokens"] == T}
        tot = {}
        for col in ("fused_us", "eager_us", "compile_us"):
            vals = [by[op][col] for op in STEP_OPS]
            tot[col] = None if None in vals else s["layers"] * sum(n * by[op][col] for op, n in STEP_OPS.items())
        print(f"  T={T:4d}: fused {tot['fused_us']:9.1f}  eager {tot['eager_us']:9.1f}  compile "
              + (f"{tot['compile_us']:9.1f}" if tot["compile_us"] is not None else "-"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="CPU interpreter, tiny shapes (checks the script)")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--compile", action="store_true", help="with --smoke: also torch.compile the twins (CPU inductor)")
    ap.add_argument("--json", default=None, help="write checks and timings here")
    args = ap.parse_args(argv)
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from radixkv import kernels as ops
    from radixkv.kernels import reference_layers as ref

    s = SMOKE if args.smoke else FULL
    dev = torch.device("cpu" if args.smoke else "cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    t0 = time.time()
    name = "cpu (interpreter smoke run)" if args.smoke else torch.cuda.get_device_name(dev)
    print(f"device {name}; torch {torch.__version__}; triton {__import__('triton').__version__}; shapes {s}")
    checks = correctness(ops, ref, s, dev, gen, args.smoke)
    bad = [c for c in checks if not c["ok"]]
    print(f"correctness: {len(checks) - len(bad)}/{len(checks)} checks pass"
          + "".join(f"\n  FAIL {c}" for c in bad), flush=True)
    rows = timings(ops, ref, s, dev, gen, args.smoke, use_compile=(args.compile or not args.smoke) and not args.no_compile)
    print_tables(rows, s)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"device": name, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                       "torch": torch.__version__, "triton": __import__("triton").__version__, "shapes": s,
                       "checks": checks, "timings": rows, "wall_s": round(time.time() - t0, 1)}, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
