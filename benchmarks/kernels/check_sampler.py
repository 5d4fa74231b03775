"""The sampler on the GPU: nucleus_draw (top-p / min-p by rejection) against its twin, and the time of
a whole `sample()` call per filter against the sort-based filter it replaced, in one run.

    python benchmarks/kernels/check_sampler.py [--json OUT]

Checks: the kernel's tokens equal reference_sampling.nucleus_draw_ref's on random rows at the 8B vocabulary
(a mismatch is allowed only on a near-tie, counted), every token inside the sorted definition's kept
set, and rounds per row. Timing (CUDA-graph replays, triton do_bench): S = 1, 64, 256 rows of
V = 128,256 logits."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_common import time_fn

V = 128256


def sort_filter(x: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """The filter sample() used before nucleus_draw (sort, cumsum, scatter), kept here for the comparison."""
    sorted_x, order = x.sort(dim=-1, descending=True)
    rank = torch.arange(x.shape[1], device=x.device)[None, :]
    sorted_x = sorted_x.masked_fill(rank >= top_k[:, None], float("-inf"))
    probs = torch.softmax(sorted_x, dim=-1)
    before = probs.cumsum(dim=-1) - probs
    drop = (before >= top_p[:, None]) & (rank > 0)
    drop |= probs < min_p[:, None] * probs[:, :1]
    return torch.empty_like(x).scatter_(1, order, sorted_x.masked_fill(drop, float("-inf")))


def kept(x: torch.Tensor, top_p: float) -> torch.Tensor:
    p = torch.softmax(x.double(), dim=-1)
    order = p.argsort(descending=True)
    keep = torch.zeros_like(p, dtype=torch.bool)
    keep[order] = (p[order].cumsum(0) - p[order]) < top_p
    return keep


def checks(dev: torch.device) -> dict:
    from radixkv.kernels import nucleus_draw
    from radixkv.kernels.reference_sampling import nucleus_draw_ref

    g = torch.Generator(device=dev).manual_seed(0)
    S = 64
    x = torch.randn(S, V, device=dev, generator=g) * torch.linspace(0.5, 6.0, S, device=dev)[:, None]
    inv_t = torch.full((S,), 1.25, device=dev)
    top_p = torch.linspace(0.3, 0.99, S, device=dev)
    min_p = torch.where(torch.arange(S, device=dev) % 4 == 0, 0.05, 0.0)
    seed = torch.arange(S, device=dev, dtype=torch.int64) * 1000003
    counter = torch.full((S,), 7, device=dev, dtype=torch.int64)
    rounds = torch.empty(S, dtype=torch.int32, device=dev)
    got = nucleus_draw(x, inv_t, top_p, min_p, seed, counter, rounds=rounds)
    want = nucleus_draw_ref(x, inv_t, top_p, min_p, seed, counter)
    inside = all(bool(kept(x[r] * 1.25, float(top_p[r]))[got[r]]) for r in range(S))
    res = {"rows": S, "equal_twin": int((got == want).sum()), "inside_kept_set": inside,
           "rounds_max": int(rounds.max()), "rounds_mean": float(rounds.float().mean())}
    print(f"  nucleus_draw vs twin: {res}")
    return res


def timings(dev: torch.device) -> list[dict]:
    from radixkv.engine.sampling import sample, sampling_rows
    from radixkv.sampling_params import SamplingParams

    cases = {"greedy": SamplingParams(temperature=0.0), "temperature 0.8": SamplingParams(temperature=0.8),
             "top-p 0.95": SamplingParams(temperature=0.8, top_p=0.95),
             "top-k 50 + top-p 0.9": SamplingParams(temperature=0.8, top_k=50, top_p=0.9),
             "min-p 0.05": SamplingParams(temperature=0.8, min_p=0.05)}
    rows = []
    for S in (1, 64, 256):
        logits = torch.randn(S, V, device=dev) * 3
        for name, p in cases.items():
            sr = sampling_rows([p] * S, list(range(S)), [5] * S, V, dev)
            t = time_fn(lambda: sample(logits, sr), False)  # noqa: B023
            rows.append({"rows": S, "case": name, "us": round(t.us, 1), "path": "radixkv"})
            print(f"  S {S:3d} {name:22s} {t.us:8.1f} us")
            if sr.filtered:
                from radixkv.kernels import gumbel_argmax

                def old():
                    inv = 1.0 / sr.temperature  # noqa: B023
                    x = sort_filter(logits * inv[:, None], sr.top_k, sr.top_p, sr.min_p)  # noqa: B023
                    return gumbel_argmax(x, torch.ones_like(inv), sr.seed, sr.counter)  # noqa: B023

                t = time_fn(old, False)
                rows.append({"rows": S, "case": name, "us": round(t.us, 1), "path": "sort (before)"})
                print(f"  S {S:3d} {name:22s} {t.us:8.1f} us  (sort, before)")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("check_sampler: needs a CUDA GPU")
    dev = torch.device("cuda")
    res = {"checks": checks(dev), "timings": timings(dev)}
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    print(f"\n{'rows':>5s} {'case':22s} {'radixkv us':>11s} {'sort us':>9s}")
    before = {(r["rows"], r["case"]): r["us"] for r in res["timings"] if r["path"] != "radixkv"}
    for r in res["timings"]:
        if r["path"] == "radixkv":
            b = before.get((r["rows"], r["case"]))
            print(f"{r['rows']:5d} {r['case']:22s} {r['us']:11.1f} {'' if b is None else f'{b:9.1f}'}")


if __name__ == "__main__":
    main()
