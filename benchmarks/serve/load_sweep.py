"""Latency under load: Poisson-rate sweeps through `radixkv serve` and in-process, TTFT / ITL / goodput.

For each workload and rate, one seeded list of requests with Poisson arrival times (bench-serve's
`send_times`) goes through
  * server: `radixkv serve` (its own process, a free port, /health awaited) driven by bench-serve's client
    (aiohttp, streaming /v1/completions with token ids, `return_token_ids` so every step is a timed chunk);
  * inproc: `AsyncLLM(LLM(...))` (the engine core on a thread, no HTTP), the same prompts at the same times.
Workloads (token-id prompts, greedy, ignore_eos):
  * shared-prefix: bench-serve's prefix-repetition set: one of 8 shared 2,048-token prefixes + 128 own tokens,
    128 output tokens;
  * sharegpt: vLLM's benchmark_throughput ShareGPT pairs (first human turn as SmolLM2 token ids, the reply's
    token count as max_tokens, vLLM's length filters; bench_common.sharegpt_pairs).
Requests per rate: rate x --duration (at least --min-requests). Each run starts with an empty prefix cache
(after a warm-up run of the same workload). Per (workload, rate, mode) a row of serve_load.json:
  ttft_p50/p99, itl_p50/p90/p99 (ms; ITL = gaps between token chunks of a request, all requests pooled),
  output_tok_s (output tokens / the run's wall time), goodput = the share of requests with TTFT <= 500 ms
  and TPOT (the request's mean ITL: (latency - TTFT) / (tokens - 1)) <= 50 ms, goodput_req_s,
  running_mean = the mean of the engine's running requests sampled every 0.25 s while > 0 (/metrics
  radixkv:num_requests_running, or EngineStats.num_running in-process), and
  decode_step_ms = the engine's decode-only step at that batch: round(running_mean) of the run's own prompts
  prefilled in-process, then the median of --decode-steps single `LLM.step()`s with async scheduling off
  (one step = one forward, CUDA-graph replay), mixed steps excluded.
Rows merge into --json by (workload, rate, mode); the plot (docs/serve_load.png: TTFT and ITL percentiles
against the rate, server solid, in-process dashed, the decode step dotted) is drawn from the JSON.

H200 (Llama-3-8B shape, random bf16 weights, ~4 min):
    python benchmarks/serve/load_sweep.py
CPU smoke (tiny model, ~1.5 min):
    python benchmarks/serve/load_sweep.py --smoke
Plot only, from the JSON, on any machine:
    python benchmarks/serve/load_sweep.py --plot-only
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import math
import signal
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench_common import (
    LOW_ID,
    REPO,
    Server,
    add_engine_flags,
    add_model_args,
    engine_kwargs,
    fold_ids,
    http,
    json_path,
    log_dir,
    merge_rows,
    model_label,
    resolve_model,
    results_from_summary,
    running_sampler,
    sharegpt_file,
    sharegpt_pairs,
    smoke_engine_defaults,
    smollm2_tokenizer,
    table,
    token_id_chunks,
)

WORKLOADS = ("shared-prefix", "sharegpt")
MODES = ("server", "inproc")
KEYS = ("workload", "rate", "mode")
ROW_KEYS = ("workload", "rate", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p90_ms", "itl_p99_ms", "decode_step_ms",
            "output_tok_s")  # the keys, in its order
PCTS = (50.0, 90.0, 99.0)
FULL = dict(rates="4,16,48,96", duration=10.0, min_requests=40, prefix_len=2048, suffix_len=128, num_prefixes=8,
            output_len=128, warmup=16, decode_steps=32)
SMOKE = dict(rates="4,16", duration=2.0, min_requests=8, prefix_len=96, suffix_len=16, num_prefixes=2,
             output_len=32, warmup=4, decode_steps=8)
SMOKE_SHAREGPT_CAP = (96, 32)  # --smoke: ShareGPT prompts cut to 96 tokens, outputs to 32


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(p, "Llama-3's 128,256")
    add_engine_flags(p)
    g = p.add_argument_group("sweep (defaults: the H200 run; --smoke: tiny)")
    g.add_argument("--rates", help=f"comma-separated requests/s (default {FULL['rates']}; smoke {SMOKE['rates']})")
    g.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated: " + ", ".join(WORKLOADS))
    g.add_argument("--modes", default=",".join(MODES), help="comma-separated: server, inproc")
    for k in ("duration", "min_requests", "prefix_len", "suffix_len", "num_prefixes", "output_len", "warmup",
              "decode_steps"):
        g.add_argument("--" + k.replace("_", "-"), type=type(FULL[k]),
                       help=f"default {FULL[k]} (smoke {SMOKE[k]})")
    g.add_argument("--max-requests", type=int, default=2000, help="cap on one run's requests (default 2000)")
    g.add_argument("--prompt-seed", type=int, default=0, help="prompts and arrival times")
    g.add_argument("--sharegpt", help="ShareGPT JSONL (default: .devshare/sharegpt/ or ../shared/traces/sharegpt/)")
    g.add_argument("--tokenizer", help="SmolLM2 tokenizer folder (default: .devshare/smollm2-tokenizer or the GGUF's)")
    g.add_argument("--slo-ttft-ms", type=float, default=500.0)
    g.add_argument("--slo-tpot-ms", type=float, default=50.0, help="SLO on a request's mean ITL (TPOT)")
    g.add_argument("--server-timeout", type=float, default=1800.0, help="seconds to wait for /health")
    p.add_argument("--json", help="rows merge into this file (default benchmarks/results/serve_load.json; "
                                  "--smoke: a temp file)")
    p.add_argument("--plot", default=str(REPO / "docs" / "serve_load.png"), help="plot path (default docs/serve_load.png)")
    p.add_argument("--no-plot", action="store_true", help="skip the plot")
    p.add_argument("--plot-only", action="store_true", help="only draw the plot from --json's rows")
    a = p.parse_args()
    base = SMOKE if a.smoke else FULL
    for k, v in base.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    a.rates = [float(r) for r in str(a.rates).split(",") if r]
    a.workloads = [w for w in a.workloads.split(",") if w]
    a.modes = [m for m in a.modes.split(",") if m]
    if set(a.workloads) - set(WORKLOADS) or set(a.modes) - set(MODES) or not a.rates or min(a.rates) <= 0:
        p.error(f"--workloads from {WORKLOADS}, --modes from {MODES}, --rates positive")
    if a.smoke and not a.json and a.plot == str(REPO / "docs" / "serve_load.png"):
        a.plot = str(json_path(a, "serve_load.png"))  # a smoke run leaves docs/ alone
    return a


# ---------------------------------------------------------------- workloads

def build_workloads(a: argparse.Namespace, vocab: int) -> dict[str, dict[float, list]]:
    """{workload: {rate: [BenchRequest with arrival_s]}}: the same requests and times for both modes."""
    from radixkv.serve.bench_client import send_times
    from radixkv.serve.bench_datasets import prefix_repetition_dataset
    from radixkv.serve.bench_results import BenchRequest

    count = {r: max(a.min_requests, min(a.max_requests, round(r * a.duration))) for r in a.rates}
    most = max(count.values()) + a.warmup
    pools: dict[str, list] = {}
    if "shared-prefix" in a.workloads:
        pools["shared-prefix"] = prefix_repetition_dataset(most, a.prefix_len, a.suffix_len, a.num_prefixes,
                                                           a.output_len, vocab_size=vocab, low=LOW_ID, seed=a.prompt_seed)
    if "sharegpt" in a.workloads:
        pairs = sharegpt_pairs(sharegpt_file(a.sharegpt), smollm2_tokenizer(a.tokenizer), most, a.prompt_seed)
        cap_in, cap_out = SMOKE_SHAREGPT_CAP if a.smoke else (None, None)
        pools["sharegpt"] = [BenchRequest(fold_ids(p[:cap_in], vocab), min(n, cap_out or n)) for p, n in pairs]
    out: dict[str, dict[float, list]] = {}
    for w, pool in pools.items():
        out[w] = {"warmup": pool[:a.warmup]}
        for rate, n in count.items():
            reqs = [pool[a.warmup + i % (len(pool) - a.warmup)] for i in range(n)]  # repeats only past the pool
            times = send_times(reqs, rate, a.prompt_seed + int(rate * 1000))
            out[w][rate] = [BenchRequest(r.prompt, r.output_len, t) for r, t in zip(reqs, times)]
    return out


def summarize_run(results: list, duration: float, running: list[float], a: argparse.Namespace) -> dict:
    """A row's numbers from per-request RequestResults (bench_results.summarize: linear percentiles)."""
    from radixkv.serve.bench_results import summarize

    s = summarize(results, duration, PCTS)
    ok = [r for r in results if r.success]
    good = [r for r in ok if r.ttft * 1e3 <= a.slo_ttft_ms and (r.tpot is None or r.tpot * 1e3 <= a.slo_tpot_ms)]
    busy = [x for x in running if x > 0]
    return dict(ttft_p50_ms=s["median_ttft_ms"], ttft_p99_ms=s["p99_ttft_ms"], itl_p50_ms=s["median_itl_ms"],
                itl_p90_ms=s["p90_itl_ms"], itl_p99_ms=s["p99_itl_ms"], output_tok_s=s["output_throughput"],
                goodput=len(good) / len(results), goodput_req_s=len(good) / duration,
                running_mean=statistics.fmean(busy) if busy else 0.0, requests=len(results), failed=s["failed"],
                tpot_p50_ms=s["median_tpot_ms"], duration_s=duration, hit_rate=s["prefix_hit_rate"],
                errors=s["errors"] or None)


def print_run(workload: str, rate: float, mode: str, r: dict) -> None:
    print(f"  {mode} {workload} @ {rate:g}/s: {r['requests']} requests ({r['failed']} failed) in {r['duration_s']:.1f} s, "
          f"TTFT p50/p99 {r['ttft_p50_ms']:.1f}/{r['ttft_p99_ms']:.1f} ms, ITL p50/p90/p99 {r['itl_p50_ms']:.2f}/"
          f"{r['itl_p90_ms']:.2f}/{r['itl_p99_ms']:.2f} ms, {r['output_tok_s']:.0f} out tok/s, goodput "
          f"{r['goodput']:.0%}, running {r['running_mean']:.1f}", flush=True)


# ---------------------------------------------------------------- server

def run_server(a: argparse.Namespace, model: str, work: dict, logs: Path) -> dict[tuple, dict]:
    from radixkv.serve.bench_client import run_async, run_benchmark
    from radixkv.serve.bench_results import BenchConfig

    cfg = BenchConfig(base_url="", model="bench", ignore_eos=True, temperature=0.0, percentiles=PCTS, timeout_s=600.0)
    out: dict[tuple, dict] = {}
    server = Server(model, a, logs / "server.log")
    try:
        t = time.perf_counter()
        server.wait_healthy(a.server_timeout)
        print(f"  server healthy after {time.perf_counter() - t:.1f} s", flush=True)
        cfg.base_url = server.url
        for w, runs in work.items():
            for rate, reqs in runs.items():
                http(server.url + "/reset_prefix_cache", data=b"")
                stop, samples = threading.Event(), []
                sampler = threading.Thread(target=running_sampler, args=(server.url, stop, samples), daemon=True)
                sampler.start()
                try:
                    with token_id_chunks():
                        summary = run_async(run_benchmark(cfg, reqs, math.inf if rate == "warmup" else None))
                finally:
                    stop.set()
                    sampler.join()
                if rate == "warmup":
                    print(f"  server {w} warm-up: {summary['completed']}/{len(reqs)} in {summary['duration']:.1f} s")
                    continue
                out[(w, rate)] = summarize_run(results_from_summary(summary), summary["duration"], samples, a)
                print_run(w, rate, "server", out[(w, rate)])
    finally:
        server.stop()
    return out


# ---------------------------------------------------------------- in-process

async def drive_inproc(engine: Any, reqs: list, rate: Any) -> tuple[list, float, list[float]]:
    """Every request at its arrival time through AsyncLLM.add_request; RequestResults timed as bench-serve
    times chunks: TTFT to the first output carrying tokens, ITL between such outputs."""
    from radixkv import SamplingParams
    from radixkv.serve.bench_results import RequestResult

    samples: list[float] = []
    t0 = time.perf_counter()

    async def one(req: Any) -> RequestResult:
        at = 0.0 if rate == "warmup" else req.arrival_s
        await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
        res = RequestResult(prompt_tokens=len(req.prompt))
        start = last = time.perf_counter()
        res.start = start - t0
        n = 0
        try:
            stream = await engine.add_request(req.prompt, SamplingParams(max_tokens=req.output_len, temperature=0.0,
                                                                         ignore_eos=True))
            async for o in stream:
                if o.delta_token_ids:
                    now = time.perf_counter()
                    if n:
                        res.itl.append(now - last)
                    else:
                        res.ttft, res.cached_tokens = now - start, o.num_cached_tokens
                    n, last = n + len(o.delta_token_ids), now
        except Exception as err:  # noqa: BLE001 - one failed request fails only itself
            res.error = f"{type(err).__name__}: {err}"
            return res
        res.latency, res.output_tokens, res.success = time.perf_counter() - start, n, n > 0
        return res

    async def sample() -> None:
        while True:
            await asyncio.sleep(0.25)
            samples.append(float(engine.engine_stats.num_running))

    sampler = asyncio.ensure_future(sample())
    results = await asyncio.gather(*(one(r) for r in reqs))
    duration = time.perf_counter() - t0
    sampler.cancel()
    return list(results), duration, samples


def run_inproc(a: argparse.Namespace, llm: Any, work: dict) -> dict[tuple, dict]:
    from radixkv.serve.async_engine import AsyncLLM

    out: dict[tuple, dict] = {}

    async def sweep() -> None:
        engine = AsyncLLM(llm, log_interval_s=None)
        try:
            for w, runs in work.items():
                for rate, reqs in runs.items():
                    await engine.reset_prefix_cache()
                    results, duration, samples = await drive_inproc(engine, reqs, rate)
                    if rate == "warmup":
                        print(f"  inproc {w} warm-up: {sum(r.success for r in results)}/{len(reqs)} in {duration:.1f} s")
                        continue
                    out[(w, rate)] = summarize_run(results, duration, samples, a)
                    print_run(w, rate, "inproc", out[(w, rate)])
        finally:
            engine.shutdown()

    asyncio.run(sweep())
    return out


def decode_step_ms(llm: Any, prompts: list[list[int]], batch: int, steps: int) -> float | None:
    """Median time of one decode-only `LLM.step()` with `batch` rows of `prompts` (cycled), async scheduling
    off (a step is one forward: the CUDA graph when it fits), after 4 untimed decode steps."""
    from radixkv import SamplingParams

    if batch < 1:
        return None
    saved = llm.core.async_scheduling
    llm.core.async_scheduling = False
    try:
        llm.reset_prefix_cache()
        rows = [prompts[i % len(prompts)] for i in range(batch)]
        reqs = llm.add_requests(rows, SamplingParams(max_tokens=steps + 8, temperature=0.0, ignore_eos=True))
        while not all(r.output for r in reqs):
            llm.step()
        for _ in range(4):
            llm.step()
        sync = _device_sync(llm)
        times, mixed = [], llm.core.stats().mixed_steps
        for _ in range(steps):
            sync()
            t = time.perf_counter()
            llm.step()
            sync()
            times.append(time.perf_counter() - t)
        if llm.core.stats().mixed_steps != mixed:
            print(f"  warning: mixed steps among the timed decode steps (batch {batch})", flush=True)
        while llm.has_work():
            llm.step()
    finally:
        llm.core.async_scheduling = saved
    llm.reset_prefix_cache()
    return 1e3 * statistics.median(times)


def _device_sync(llm: Any) -> Any:
    import torch

    dev = getattr(llm.runner, "device", None)
    return torch.cuda.synchronize if getattr(dev, "type", "") == "cuda" else (lambda: None)


# ---------------------------------------------------------------- plot

def plot(rows: list[dict], path: str) -> bool:
    """TTFT (p50, p99) and ITL (p50, p90, p99) against the rate, a column per workload; server solid,
    in-process dashed, decode step dotted. False (and a note) when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib import ticker
    except ImportError:
        print("  no matplotlib: plot skipped", flush=True)
        return False
    workloads = [w for w in WORKLOADS if any(r["workload"] == w for r in rows)]
    if not workloads:
        print("  no rows to plot", flush=True)
        return False
    fig, axes = plt.subplots(2, len(workloads), figsize=(6 * len(workloads), 8), squeeze=False)
    style = {"server": "-", "inproc": "--"}
    for j, w in enumerate(workloads):
        for mode in MODES:
            rs = sorted((r for r in rows if r["workload"] == w and r.get("mode", "server") == mode),
                        key=lambda r: r["rate"])
            if not rs:
                continue
            x = [r["rate"] for r in rs]
            for key, color in (("ttft_p50_ms", "C0"), ("ttft_p99_ms", "C3")):
                axes[0][j].plot(x, [r[key] for r in rs], style[mode], color=color, marker="o",
                                label=f"{key.split('_')[1]} {mode}")
            for key, color in (("itl_p50_ms", "C0"), ("itl_p90_ms", "C1"), ("itl_p99_ms", "C3")):
                axes[1][j].plot(x, [r[key] for r in rs], style[mode], color=color, marker="o",
                                label=f"{key.split('_')[1]} {mode}")
            axes[1][j].plot(x, [r.get("decode_step_ms") for r in rs], ":", color="k", marker=".",
                            label=f"decode step at the run's batch ({mode})" if mode == "server" else None)
        axes[0][j].set_title(f"{w}: time to first token")
        axes[1][j].set_title(f"{w}: inter-token latency")
        for i, ax in enumerate((axes[0][j], axes[1][j])):
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("Poisson arrival rate (requests/s)")
            ax.set_ylabel("ms")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
            ax.set_xticks(sorted({r["rate"] for r in rows if r["workload"] == w}))
            ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
            ax.xaxis.set_minor_formatter(ticker.NullFormatter())
            ax.yaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
            ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
            ax.yaxis.set_minor_formatter(ticker.NullFormatter())
    models = sorted({str(r.get("model")) for r in rows})
    fig.suptitle(f"radixkv latency against load ({', '.join(models)}; solid: through the server, dashed: in-process)")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"  wrote {path}", flush=True)
    return True


COLS = [("workload", "workload", ""), ("mode", "mode", ""), ("rate", "req/s", "g"), ("running_mean", "running", ".1f"),
        ("ttft_p50_ms", "TTFT p50", ".1f"), ("ttft_p99_ms", "TTFT p99", ".1f"), ("itl_p50_ms", "ITL p50", ".2f"),
        ("itl_p90_ms", "ITL p90", ".2f"), ("itl_p99_ms", "ITL p99", ".2f"), ("decode_step_ms", "decode step", ".2f"),
        ("p90_over_step", "p90/step", ".2f"), ("p99_over_step", "p99/step", ".2f"), ("output_tok_s", "out tok/s", ".0f"),
        ("goodput", "goodput", ".0%")]


def print_table(rows: list[dict]) -> None:
    for r in rows:
        step = r.get("decode_step_ms")
        r["p90_over_step"] = r["itl_p90_ms"] / step if step else None
        r["p99_over_step"] = r["itl_p99_ms"] / step if step else None
    print("\n" + table(rows, COLS))
    print("goodput: share of requests with TTFT <= 500 ms and TPOT (mean ITL of the request) <= 50 ms; "
          "decode step: median decode-only LLM.step() at round(running), async scheduling off")
    for r in rows:
        r.pop("p90_over_step"), r.pop("p99_over_step")


# ---------------------------------------------------------------- main

def main() -> int:
    a = parse_args()
    out_json = json_path(a, "serve_load.json")
    if a.plot_only:
        import json

        rows = json.loads(out_json.read_text())
        plot(rows, a.plot)
        print_table(rows)
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally that stops the server
    smoke_engine_defaults(a)
    logs = log_dir(a, "load_sweep")
    model, vocab = resolve_model(a, logs)
    label = model_label(a, vocab)
    print(f"model {model} ({label}), rates {a.rates}, workloads {a.workloads}, modes {a.modes}; logs in {logs}",
          flush=True)
    work = build_workloads(a, vocab)
    for w, runs in work.items():
        print(f"  {w}: " + ", ".join(f"{k}: {len(v)} requests" for k, v in runs.items()), flush=True)
    res: dict[str, dict[tuple, dict]] = {}
    slo = f"ttft<={a.slo_ttft_ms:g}ms,tpot<={a.slo_tpot_ms:g}ms"
    steps: dict[tuple[str, int], float | None] = {}  # (workload, batch) -> ms: one timing a batch size

    def rows_now() -> list[dict]:
        """The rows so far (decode_step_ms None until timed); merged after each stage, so a run cut short
        (a timeout) keeps what it measured."""
        out = []
        for mode, by_run in res.items():
            for (w, rate), r in by_run.items():
                batch = max(1, round(r["running_mean"]))
                out.append(dict(workload=w, rate=rate, ttft_p50_ms=r["ttft_p50_ms"], ttft_p99_ms=r["ttft_p99_ms"],
                                itl_p50_ms=r["itl_p50_ms"], itl_p90_ms=r["itl_p90_ms"], itl_p99_ms=r["itl_p99_ms"],
                                decode_step_ms=steps.get((w, batch)), output_tok_s=r["output_tok_s"], mode=mode,
                                **{k: v for k, v in r.items() if k not in ROW_KEYS}, decode_batch=batch, model=label,
                                slo=slo, date=time.strftime("%Y-%m-%d %H:%M")))
        return out

    if "server" in a.modes:
        res["server"] = run_server(a, model, work, logs)
        merge_rows(out_json, rows_now(), KEYS)
    from radixkv import LLM

    t = time.perf_counter()
    llm = LLM(model, usage="serve", **engine_kwargs(a))  # the server's defaults (config.engine_step_budget), as `radixkv serve` takes them
    print(f"  in-process LLM built in {time.perf_counter() - t:.1f} s ({llm.num_pages} pages)", flush=True)
    if "inproc" in a.modes:
        res["inproc"] = run_inproc(a, llm, work)
        merge_rows(out_json, rows_now(), KEYS)
    for by_run in res.values():
        for (w, rate), r in by_run.items():
            batch = max(1, round(r["running_mean"]))
            if (w, batch) not in steps:
                steps[(w, batch)] = decode_step_ms(llm, [q.prompt for q in work[w][rate]], batch, a.decode_steps)
                print(f"  decode step, {w} at batch {batch}: {steps[(w, batch)] or 0:.2f} ms", flush=True)
    rows = rows_now()
    del llm
    gc.collect()
    all_rows = merge_rows(out_json, rows, KEYS)
    print(f"  {len(rows)} rows merged into {out_json}", flush=True)
    if not a.no_plot:
        plot([r for r in all_rows if r.get("model") == label], a.plot)
    print_table(rows)
    return 0 if all(r["failed"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
