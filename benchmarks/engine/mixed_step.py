"""Mixed steps (decode rows + a prompt chunk) against decode-only steps, on the H200 (issue 31 item 2).

    python benchmarks/engine/mixed_step.py --json OUT.json        # on the GPU machine
    python benchmarks/engine/mixed_step.py --smoke                # CPU, tiny model: checks the script

A Llama-3-8B-shaped model (random bf16 weights, async scheduling off, so one `LLM.step()` is one device
step). `--rows` requests of `--prompt` tokens are prefilled and decode; then for each chunk size C one
fresh request of C random tokens (max_tokens 1: it finishes in the step) joins, and the one step that
carries the decode rows and its C-token chunk is timed (whole `LLM.step()`: scheduling, planning,
forward, sampling, update), median of --reps after a warm-up step, in three modes:

    before:  every mixed step eager, all rows in paged_prefill (the engine before issue 31)
    split:   eager, the decode rows through paged_decode (PagedAttention's MixedSplit)
    graphs:  piecewise CUDA graphs (engine/piecewise_graphs.py) + split, one step() timed alone

and, with async scheduling on (the engine's default on CUDA; the step ahead is planned while the one
before runs, admissions and chunks included): "ahead", the steady state of --steady steps that each carry
the decode rows and one fresh C-token request (added before each step() call), wall time per step,
against "ahead decode", the same rows' decode-only steady state. That is what a server sees under load;
the issue's targets (1.3x decode at 32 / 128 tokens, 1.2x max(decode, compute) at 512) are read off it.

Also: the dense bf16 GEMM rate (8192^3 torch.mm) and each chunk's compute time at that rate (2 x the
layers' weights a token, the chunk's causal attention); a correctness check of one mixed step (graph
logits vs the eager ones, before and after the split); greedy generate of a small model with and without
graphs over mixed steps; torch.profiler and cProfile of one mixed step before and after (where the time
goes). Prints a table last; rows to --json.
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import pstats
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from gpu_engine_check import llama3_8b_config, small_config

from radixkv import LLM, SamplingParams

MODES = ("before", "split", "graphs")


def log(*a: Any) -> None:
    print(*a, flush=True)


def set_mode(llm: LLM, mode: str, saved: dict) -> None:
    r = llm.runner
    saved.setdefault("mixed", getattr(r, "mixed_graphs", None))
    r.mixed_graphs = saved["mixed"] if mode == "graphs" else None
    r.attention.split_mixed = mode != "before"


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def gemm_tflops(device: str, smoke: bool) -> float:
    n = 512 if smoke else 8192
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16 if device == "cuda" else torch.float32)
    b = torch.randn_like(a)
    for _ in range(3):
        a @ b
    sync(device)
    reps = 3 if smoke else 20
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    sync(device)
    return 2 * n ** 3 * reps / (time.perf_counter() - t) / 1e12


def chunk_flops(spec: Any, c: int, prefix: int = 0) -> float:
    """FLOPs of a c-token chunk: 2 x the layers' weights a token (q/k/v, o, gate/up, down), its causal attention."""
    h, i, L = spec.hidden_size, spec.intermediate_size, spec.num_layers
    hq, hkv, d = spec.num_q_heads, spec.num_kv_heads, spec.head_dim
    weights = L * (h * (hq + 2 * hkv) * d + hq * d * h + 2 * h * i + i * h)
    attn = L * hq * d * 4 * (c * prefix + c * (c + 1) / 2)
    return 2 * weights * c + attn


class Engine:
    """An LLM with `rows` decoding requests; mixed(C) times one step with a C-token chunk joining."""

    def __init__(self, llm: LLM, rows: int, prompt: int, device: str) -> None:
        self.llm, self.device, self.rows = llm, device, rows
        self.vocab = llm.runner.vocab_size
        self.g = torch.Generator().manual_seed(0)
        prompts = [self.tokens(prompt) for _ in range(rows)]
        llm.add_requests(prompts, SamplingParams(temperature=0.0, max_tokens=2000 if device == "cpu" else 8000, ignore_eos=True))
        while llm.core.scheduler.num_running < rows or any(
                e.req.num_tokens - e.req.num_computed > 1 for e in llm.core.scheduler.running):
            llm.step()
        for _ in range(3):
            llm.step()

    def tokens(self, n: int) -> list[int]:
        return torch.randint(3, self.vocab, (n,), generator=self.g).tolist()

    def decode(self, reps: int) -> float:
        ts = []
        for _ in range(reps):
            t = time.perf_counter()
            self.llm.step()
            ts.append(time.perf_counter() - t)
        return statistics.median(ts) * 1e3

    def mixed_once(self, chunk: int) -> float:
        self.llm.add_requests([self.tokens(chunk)], SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True))
        t = time.perf_counter()
        done = self.llm.step()
        dt = time.perf_counter() - t
        assert len(done) == 1, f"the {chunk}-token request did not finish in its step"
        return dt * 1e3

    def steady(self, chunk: int, steps: int, around: Callable[[], Any] = contextlib.nullcontext) -> float:
        """Async scheduling on: ms per step over `steps` steps, each adding one fresh `chunk`-token request
        (max_tokens 1) before its step() call (chunk 0: decode-only); back to sync and the same rows after.
        around: a context manager factory entered around the timed steps (a profiler)."""
        llm, core = self.llm, self.llm.core
        core.async_scheduling = True
        params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)

        def run(n: int) -> None:
            for _ in range(n):
                if chunk:
                    llm.add_requests([self.tokens(chunk)], params)
                llm.step()
        run(4)  # warm-up: the overlap starts
        sync(self.device)
        with around():
            t = time.perf_counter()
            run(steps)
            sync(self.device)
            dt = (time.perf_counter() - t) / steps * 1e3
        core.async_scheduling = False
        while core.scheduler.num_waiting or len(core.scheduler.running) > self.rows or core._ahead is not None:
            llm.step()
        return dt

    def mixed(self, chunk: int, reps: int) -> float:
        self.mixed_once(chunk)  # warm-up: compiles, first-use captures
        self.llm.step()
        ts = []
        for _ in range(reps):
            ts.append(self.mixed_once(chunk))
            self.llm.step()  # a decode step between: the same 64 rows every time
        return statistics.median(ts)


def profile_step(eng: Engine, chunk: int, device: str, label: str) -> dict:
    """torch.profiler (device kernels) and cProfile (host) of mixed steps of `chunk` tokens."""
    from torch.profiler import ProfilerActivity, profile

    n = 3
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    eng.mixed_once(chunk)
    eng.llm.step()
    with profile(activities=acts) as prof:
        for _ in range(n):
            eng.mixed_once(chunk)
            eng.llm.step()  # decode steps profiled too: subtracted below
    with profile(activities=acts) as prof_dec:
        for _ in range(n):
            eng.llm.step()
    out: dict[str, Any] = {}
    if device == "cuda":
        def kernels(p: Any) -> dict[str, tuple[float, int]]:
            k: dict[str, tuple[float, int]] = {}
            for e in p.key_averages():
                if e.device_type.name == "CUDA" or getattr(e, "self_device_time_total", 0) and not e.cpu_children:
                    t = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
                    if t > 0:
                        k[e.key] = (t / 1e3, e.count)
            return k
        km, kd = kernels(prof), kernels(prof_dec)
        tot_m, tot_d = sum(v[0] for v in km.values()), sum(v[0] for v in kd.values())
        cnt_m, cnt_d = sum(v[1] for v in km.values()), sum(v[1] for v in kd.values())
        out["gpu_ms_mixed_step"] = (tot_m - tot_d) / n
        out["kernels_mixed_step"] = (cnt_m - cnt_d) / n
        out["gpu_ms_decode_step"] = tot_d / n
        diff = {k: ((km[k][0] - kd.get(k, (0, 0))[0]) / n, (km[k][1] - kd.get(k, (0, 0))[1]) / n) for k in km}
        top = sorted(diff.items(), key=lambda kv: -kv[1][0])[:10]
        out["top_kernels"] = [(k[:70], round(t, 3), round(c, 1)) for k, (t, c) in top]
    # host time of the mixed step alone
    eng.mixed_once(chunk)
    eng.llm.step()
    pr = cProfile.Profile()
    eng.llm.add_requests([eng.tokens(chunk)], SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True))
    pr.enable()
    eng.llm.step()
    pr.disable()
    eng.llm.step()
    out["host_ms_total"] = pstats.Stats(pr).total_tt * 1e3
    out["host_top"], out["host_cum"] = host_tables(
        pr, 14, "attend|_piece|replay|plan|paged_prefill|paged_decode|store_kv|hidden|forward|launch|schedule|"
        "collect|run", 24)
    log_profile(f"profile {label}, chunk {chunk}", out)
    return out


def host_tables(pr: cProfile.Profile, top: int, cum_pattern: str, cum_rows: int) -> tuple[list[str], list[str]]:
    """cProfile's rows: the `top` by own time, and the first `cum_rows` by cumulative time of the functions
    matching cum_pattern."""
    def rows(sort: str, *restrict: Any) -> list[str]:
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats(sort).print_stats(*restrict)
        return [ln for ln in s.getvalue().splitlines() if ln.strip() and ln.strip()[0].isdigit()]
    return rows("tottime", top)[:top], rows("cumulative", cum_pattern)[:cum_rows]


def log_profile(title: str, out: dict) -> None:
    """A profile's numbers on one line, then its top kernels and host tables."""
    tables = ("host_top", "host_cum", "top_kernels")
    log(f"--- {title}: " + json.dumps({k: (round(v, 3) if isinstance(v, float) else v)
                                     for k, v in out.items() if k not in tables}))
    for row in out.get("top_kernels", []):
        log(f"    gpu {row[1]:8.3f} ms/step  x{row[2]:6.1f}  {row[0]}")
    for ln in out["host_top"]:
        log("    host " + ln)
    for ln in out["host_cum"]:
        log("    cum  " + ln)


def profile_ahead(eng: Engine, chunk: int, device: str, steps: int = 20) -> dict:
    """Where an async steady-state step of `chunk` tokens (0: decode-only) goes: device kernel time a step
    (torch.profiler, device activity only) against the wall time a step, and the host's busy time a step
    (cProfile: all but the wait for the step's tokens) by function."""
    from torch.profiler import ProfilerActivity, profile

    out: dict[str, Any] = {"chunk": chunk}
    if device == "cuda":
        holder: list = []

        @contextlib.contextmanager
        def kernels() -> Any:
            with profile(activities=[ProfilerActivity.CUDA]) as p:
                yield
            holder.append(p)
        out["wall_ms"] = eng.steady(chunk, steps, kernels)
        evs = [e for e in holder[0].key_averages() if getattr(e, "self_device_time_total", 0) > 0]
        out["gpu_ms"] = sum(e.self_device_time_total for e in evs) / 1e3 / steps
        out["kernels"] = sum(e.count for e in evs) / steps
        out["top_kernels"] = [(e.key[:70], round(e.self_device_time_total / 1e3 / steps, 3), e.count / steps)
                              for e in sorted(evs, key=lambda e: -e.self_device_time_total)[:8]]
    pr = cProfile.Profile()

    @contextlib.contextmanager
    def host() -> Any:
        pr.enable()
        yield
        pr.disable()
    out["wall_ms_cprofile"] = eng.steady(chunk, steps, host)
    st = pstats.Stats(pr)
    # the waits for a step's tokens: the built-in synchronize calls' own time (pstats names built-ins by "~")
    waits = sum(v[2] for k, v in st.stats.items() if k[0] == "~" and "synchronize" in k[2])
    out["host_ms"] = (st.total_tt - waits) * 1e3 / steps
    out["wait_ms"] = waits * 1e3 / steps
    out["host_top"], out["host_cum"] = host_tables(
        pr, 16, "schedule_ahead|_admit|launch|forward|sample|collect|update|_deltas|add_requests|hidden|attend|"
        "plan|replay|process|_step|step", 30)
    log_profile(f"async steady state, chunk {chunk}", out)
    return out


def compare_logits(eng: Engine, chunk: int) -> dict:
    """One mixed step through graphs, eager + split and eager before: max |diff| of logits, argmax agreement."""
    runner = eng.llm.runner
    orig = runner.forward_local
    res: dict[str, Any] = {}

    def wrapped(batch: Any, use_graphs: bool = True, input_ids: Any = None) -> Any:
        mg = getattr(runner, "mixed_graphs", None)
        if mg is None or not mg.fits(batch) or res:
            return orig(batch, use_graphs, input_ids)
        g = mg.run(batch, input_ids).clone()
        e = orig(batch, False, input_ids).clone()
        runner.attention.split_mixed = False
        o = orig(batch, False, input_ids).clone()
        runner.attention.split_mixed = True
        res.update(chunk=chunk, rows=g.shape[0], logit_absmax=e.abs().max().item(),
                   graph_vs_split=(g - e).abs().max().item(), graph_vs_before=(g - o).abs().max().item(),
                   split_vs_before=(e - o).abs().max().item(),
                   argmax_graph_split=(g.argmax(-1) == e.argmax(-1)).float().mean().item(),
                   argmax_graph_before=(g.argmax(-1) == o.argmax(-1)).float().mean().item())
        return g

    runner.forward_local = wrapped
    try:
        eng.mixed_once(chunk)
        eng.llm.step()
    finally:
        runner.forward_local = orig
    log(f"--- logits check: {json.dumps(res)}")
    return res


def greedy_check(device: str, smoke: bool) -> dict:
    """Greedy generate on a small model with a small budget, so prompts are chunked beside decode rows (mixed
    steps): graphs vs enforce_eager (both sync), and graphs with async scheduling (mixed steps planned ahead)
    vs graphs sync."""
    cfg = small_config("llama", smoke)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 200, (n,), generator=g).tolist() for n in (9, 40, 23, 300, 150, 77)]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    res: dict[str, Any] = {}
    for kv in ("auto", "fp8_e4m3") if device == "cuda" else ("auto",):
        toks = {}
        for eager, overlap in ((False, False), (True, False), (False, True)):
            llm = LLM(cfg, dtype="bfloat16" if device == "cuda" else "float32", kv_dtype=kv, device=device,
                      num_pages=256, enforce_eager=eager, max_batch_tokens=96, async_scheduling=overlap)
            toks[eager, overlap] = [o.token_ids for o in llm.generate(prompts, params)]
            mg = getattr(llm.runner, "mixed_graphs", None)
            if not eager:
                res[f"{kv}{'_async' if overlap else ''}_mixed_replays"] = mg.replays if mg is not None else 0
            if overlap:
                res[f"{kv}_steps_ahead"] = f"{llm.core.steps_ahead}/{llm.core.num_steps}"
        for name, other in (("eager", (True, False)), ("async", (False, True))):
            same = sum(a == b for x, y in zip(toks[False, False], toks[other]) for a, b in zip(x, y))
            res[f"{kv}_tokens_equal_{name}"] = f"{same}/{sum(len(x) for x in toks[False, False])}"
    log(f"--- greedy small model, graphs vs eager, async vs sync: {json.dumps(res)}")
    return res


def section(name: str, fn: Callable[[], Any]) -> Any:
    t = time.perf_counter()
    try:
        r = fn()
        log(f"[{name}: {time.perf_counter() - t:.1f} s]")
        return r
    except Exception:  # noqa: BLE001 (a failed section is reported, the others still run)
        log(f"[{name} FAILED after {time.perf_counter() - t:.1f} s]\n{traceback.format_exc()}")
        return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--chunks", default="32,128,256,512,1024,2048,4096,8128")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--profile", default="32,512")
    ap.add_argument("--profile-modes", default="before,graphs")
    ap.add_argument("--no-greedy", action="store_true")
    ap.add_argument("--steady", type=int, default=40, help="steps of each async steady-state measurement")
    ap.add_argument("--profile-ahead", default="", help="chunk sizes whose async steady state is profiled (0: decode)")
    ap.add_argument("--json")
    a = ap.parse_args()
    device = "cpu" if a.smoke else "cuda"
    chunks = [int(c) for c in a.chunks.split(",")]
    if a.smoke:
        a.rows, a.prompt, a.reps, chunks = 4, 24, 2, [8, 32]
    results: dict[str, Any] = {"rows": a.rows, "prompt": a.prompt}
    rate = section("gemm rate", lambda: gemm_tflops(device, a.smoke))
    results["gemm_tflops"] = rate
    log(f"dense bf16 GEMM: {rate:.0f} TFLOP/s")
    t = time.perf_counter()
    llm = LLM(llama3_8b_config(a.smoke), dtype="bfloat16" if device == "cuda" else "float32", device=device,
              async_scheduling=False, **({"num_pages": 512} if a.smoke else {}))
    results["build_s"] = time.perf_counter() - t
    mg = getattr(llm.runner, "mixed_graphs", None)
    results["mixed_graphs"] = mg.num_graphs if mg is not None else 0
    results["mixed_buckets"] = mg.buckets if mg is not None else []
    log(f"engine built in {results['build_s']:.1f} s; piecewise graphs {results['mixed_graphs']} "
        f"(buckets {results['mixed_buckets']}); decode graphs {llm.runner.graphs.num_graphs if llm.runner.graphs else 0}")
    eng = Engine(llm, a.rows, a.prompt, device)
    spec = llm.runner.model.shard_spec
    saved: dict = {}
    results["decode_ms"] = section("decode", lambda: eng.decode(4 * a.reps + 5))
    log(f"decode-only step, {a.rows} rows: {results['decode_ms']:.2f} ms")
    results["decode_ahead_ms"] = section("ahead decode", lambda: eng.steady(0, a.steady))
    log(f"decode-only steady state, async: {results['decode_ahead_ms']:.2f} ms/step")
    if device == "cuda":
        results["logits"] = section("logits check", lambda: [compare_logits(eng, c) for c in (32, 512)])
    rows = []
    for c in chunks:
        row: dict[str, Any] = {"chunk": c, "compute_ms": chunk_flops(spec, c) / (rate * 1e12) * 1e3}
        for mode in a.modes.split(","):
            set_mode(llm, mode, saved)
            row[mode] = section(f"{mode} {c}", lambda c=c: eng.mixed(c, a.reps))
        set_mode(llm, "graphs", saved)
        row["ahead"] = section(f"ahead {c}", lambda c=c: eng.steady(c, a.steady))
        rows.append(row)
        log(f"chunk {c}: " + json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()}))
    results["rows_table"] = rows
    prof = {}
    for c in [int(x) for x in a.profile.split(",") if x]:
        for mode in a.profile_modes.split(","):
            set_mode(llm, mode, saved)
            prof[f"{mode}_{c}"] = section(f"profile {mode} {c}", lambda c=c, mode=mode: profile_step(eng, c, device, mode))
    set_mode(llm, "graphs", saved)
    for c in [int(x) for x in a.profile_ahead.split(",") if x]:
        prof[f"ahead_{c}"] = section(f"profile ahead {c}", lambda c=c: profile_ahead(eng, c, device))
    results["profile"] = prof
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1, default=str))
    if not a.no_greedy:
        results["greedy"] = section("greedy check", lambda: greedy_check(device, a.smoke))
        if a.json:
            Path(a.json).write_text(json.dumps(results, indent=1, default=str))
    dec, dec_a = results["decode_ms"], results["decode_ahead_ms"]
    log(f"\n=== {a.rows} decode rows (prompt {a.prompt}) on {torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}; "
        f"decode-only {dec:.2f} ms (async steady state {dec_a:.2f}); GEMM {rate:.0f} TFLOP/s; build {results['build_s']:.0f} s")
    log(f"{'chunk':>6} {'compute':>8} " + " ".join(f"{m:>8}" for m in a.modes.split(","))
        + f" {'graphs/dec':>10} {'ahead':>8} {'ahead/dec':>9} {'of target':>9} {'prefill tok/s':>13}")
    fmt = lambda v: f"{v:8.2f}" if isinstance(v, float) else f"{'-':>8}"
    for r in rows:
        g, ah = r.get("graphs"), r.get("ahead")
        # the bound: 1.3x decode up to 128 tokens, else 1.2x max(decode, the chunk's compute)
        target = (1.3 * dec_a) if r["chunk"] <= 128 else 1.2 * max(dec_a, r["compute_ms"])
        r["ahead_vs_decode"] = ah / dec_a if isinstance(ah, float) else None
        r["ahead_of_target"] = ah / target if isinstance(ah, float) else None
        tok = f"{r['chunk'] / (ah / 1e3):13.0f}" if isinstance(ah, float) else f"{'-':>13}"
        log(f"{r['chunk']:>6} {r['compute_ms']:8.2f} " + " ".join(fmt(r.get(m)) for m in a.modes.split(","))
            + (f" {g / dec:10.2f}" if isinstance(g, float) else f" {'-':>10}") + f" {fmt(ah)}"
            + (f" {ah / dec_a:9.2f} {ah / target:9.2f}" if isinstance(ah, float) else f" {'-':>9} {'-':>9}") + f" {tok}")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
