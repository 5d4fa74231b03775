"""End-to-end engine benchmark for the GPU: checks, the decode sweep against the floor, the workloads.

    python benchmarks/engine/bench_e2e_gpu.py --json OUT.json                  # Part A on the H200
    python benchmarks/engine/bench_e2e_gpu.py --parts B --skip-checks --gsm8k .devshare/gsm8k \
        --sharegpt .devshare/sharegpt/sharegpt_v3_multiturn_first2000.jsonl --json OUT.json   # Part B
    python benchmarks/engine/bench_e2e_gpu.py --smoke --skip-checks --workloads --json /tmp/s.json  # CPU

1. Checks (e2e_checks.py; small random Llama, bf16 and fp8_e4m3 KV): a decode step replayed from a CUDA graph
   gives the same logits as the eager step on the same batch (bit for bit), and greedy generate
   with graphs equals generate with enforce_eager=True.
2. Decode sweep (Part A): a Llama-3-8B-shaped model (random bf16 weights built from a config),
   batch 1/16/64/256 at prompt 512 + 128 new tokens. Each row: the median wall time of a whole
   `LLM.step()` (scheduling, planning, forward, sampling, update), with CUDA graphs and eager,
   against the floor = max((weight bytes + KV bytes read) / streaming-read bandwidth, the step's matrix
   FLOPs / dense bf16 GEMM rate), both measured in the same run (rows keep bytes_floor_ms and
   compute_floor_ms: compute is the larger only for a big enough batch). Sampled decoding (temperature
   0.8, top_p 0.95) at batch 64 beside greedy. On the GPU each
   row also has `kernels_per_step` and `idle_us_per_step` (issue 35): a torch.profiler window of 12 decode
   steps (left out of the timed median), the device ops a step and the GPU's idle time between them; and
   the device time a step by phase (`gemm_us_per_step`, `attention_us_per_step`, `other_us_per_step`)
   beside each phase's own floor (`gemm_floor_ms`: max(weight bytes / bw, linear FLOPs / GEMM rate);
   `attention_floor_ms`: KV bytes / bw) and their sum `serial_floor_ms`, the floor of a step that runs
   the phases one after the other, as a layer does (floor_ms assumes they overlap).
3. Workloads (Part B), each with cache on / off (bf16), cache on with fp8_e4m3 KV at the same KV
   byte budget, and transformers' batched generate (few-shot, no-sharing: a timed subset); config
   `default` is LLM(model, dtype="bfloat16") and nothing else (the pool from gpu_memory_utilization,
   max_num_seqs, cascade, async scheduling: all the engine's defaults; bf16 is what dtype "auto" gives
   on CUDA), the row issue 31 compares with cache-off (few-shot: --only few-shot --configs default):
   - few-shot: 8-shot GSM8K, 512 questions over 4 example sets, 64 new tokens, all sent at once;
   - multi-turn: 64 conversations x 4 turns (ShareGPT lengths with --sharegpt, else the synthetic
     generator's), a shared 256-token system prompt; a conversation's next turn is sent when its
     previous one finishes: previous prompt + the engine's output + the new user tokens;
   - trace: the first 500 requests of the bundled Mooncake synthetic trace, arrivals / 20 in
     wall-clock time (they queue), prompts truncated to 2048 tokens, outputs to 128;
   - no-sharing: 512 unique random 512-token prompts, 64 new tokens (the control).
   Sizes are flags (--fs-prompts, --trace-speedup, ...); --only / --configs pick rows.
Rows go to --json (a list of objects, keys as benchmarks/results/e2e.json; a second call with the
same --json skips the rows already there) and a table last.
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections import deque
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Callable, NamedTuple

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from decode_floor import (  # noqa: E402
    dense_gemm_rate,
    kv_bytes_per_token,
    linear_flops,
    read_bandwidth,
    step_flops,
    weight_bytes,
)
from e2e_checks import check_async_equals_sync, check_graph_equals_eager, check_sampler, sync  # noqa: E402
from gpu_engine_check import llama3_8b_config  # noqa: E402

from radixkv import LLM, SamplingParams  # noqa: E402
from radixkv.request import Request  # noqa: E402

GREEDY = SamplingParams(temperature=0.0, max_tokens=128, ignore_eos=True)
SAMPLED = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=128, ignore_eos=True)


def device_events(prof: Any) -> list[Any]:
    """The device kernels and copies of a torch.profiler window."""
    return [e for e in prof.events() if getattr(e, "device_type", None) is not None and e.device_type.name == "CUDA"]


def device_gaps(prof: Any, steps: int) -> tuple[float | None, float | None]:
    """(device kernels and copies a step, device idle microseconds a step) of a torch.profiler window of
    `steps` steps: idle is the span from the window's first device op to its last less the union of their
    intervals, i.e. the time the GPU waits between kernels (the launch gaps a graph or the host leaves)."""
    spans = sorted((e.time_range.start, e.time_range.end) for e in device_events(prof))
    if not spans:
        return None, None
    busy, (lo, hi) = 0.0, spans[0]
    for a, b in spans[1:]:
        if a > hi:
            busy, lo, hi = busy + hi - lo, a, b
        else:
            hi = max(hi, b)
    busy += hi - lo
    return round(len(spans) / steps, 1), round((max(b for _, b in spans) - spans[0][0] - busy) / steps, 1)


# kernel names by phase (phase_times): the projections and LM head (cuBLAS, the fused decode kernels) and
# attention (decode, split merges, cascade); the rest (norms, activations, RoPE, stores, sampling) is "other"
GEMM_NAMES = ("nvjet", "gemm", "cutlass", "xmma", "splitkreduce", "_decode_linear_kernel")
ATTENTION_NAMES = ("_decode_kernel", "_merge_kernel", "_prefix_kernel", "_window")


def phase_times(prof: Any, steps: int) -> dict:
    """Device microseconds a step by phase (GEMM_NAMES, ATTENTION_NAMES, other) of a profiler window."""
    us = {"gemm": 0.0, "attention": 0.0, "other": 0.0}
    for e in device_events(prof):
        name = e.name.lower()
        kind = ("gemm" if any(k in name for k in GEMM_NAMES) else
                "attention" if any(k in name for k in ATTENTION_NAMES) else "other")
        us[kind] += e.time_range.end - e.time_range.start
    return {f"{k}_us_per_step": round(v / steps, 1) for k, v in us.items()}


PROFILED = 12  # decode steps of the profiled window (decode_sweep)


def decode_sweep(llm: LLM, batch: int, prompt: int, params: SamplingParams, graphs: bool, bw: float,
                 smoke: bool, overlap: bool = False, gemm_rate: float | None = None) -> dict:
    """Median whole-step time of decode-only steps for `batch` rows of `prompt` + up to 128 tokens,
    against the floor: max(bytes read / bw, the step's matrix FLOPs / gemm_rate) (bytes alone without a
    rate), both kept in the row.
    overlap: async scheduling (the host plans step N+1 while the GPU runs step N). Then a torch.profiler
    window of PROFILED decode steps (device activity only): kernels a step and the GPU's idle time a step
    between them (device_gaps; None on CPU)."""
    from torch.profiler import ProfilerActivity, profile

    saved, saved_async, ahead0 = llm.runner.graphs, llm.core.async_scheduling, llm.core.steps_ahead
    llm.runner.graphs = saved if graphs else None
    llm.core.async_scheduling = overlap
    g = torch.Generator().manual_seed(batch)
    reqs = llm.add_requests([torch.randint(3, llm.runner.spec.vocab_size, (prompt,), generator=g).tolist()
                             for _ in range(batch)], params)
    times, ctx = [], []
    window, prof = None, None
    with torch.inference_mode():
        while llm.has_work():
            decode = all(r.num_computed >= len(r.prompt) for r in reqs)
            if decode and window is None and len(times) >= 8 and llm.runner.device.type == "cuda":
                window = profile(activities=[ProfilerActivity.CUDA])  # after the timed steps' warm-up
                window.__enter__()
                start = len(times)
            t = time.perf_counter()
            llm.step()
            dt = time.perf_counter() - t
            if decode:
                times.append(dt)
                ctx.append(sum(r.num_tokens for r in reqs))
            if window is not None and prof is None and len(times) - start >= PROFILED:
                torch.cuda.synchronize()
                window.__exit__(None, None, None)
                prof, profiled = window, len(times) - start
                times, ctx = times[:start], ctx[:start]  # the profiler's own cost stays out of the step time
    llm.runner.graphs, llm.core.async_scheduling = saved, saved_async
    llm.reset_prefix_cache()
    steps = times[4:] or times  # the first decode steps capture graphs
    ms = statistics.median(steps) * 1e3
    cached = statistics.median(ctx[4:] or ctx)
    bytes_floor_ms = (weight_bytes(llm) + cached * kv_bytes_per_token(llm)) / bw * 1e3
    compute_floor_ms = step_flops(llm, batch, cached) / gemm_rate * 1e3 if gemm_rate else None
    floor_ms = max(bytes_floor_ms, compute_floor_ms or 0.0)
    # each phase's own floor: the projections' max(weight bytes, their FLOPs at the GEMM rate), attention's
    # KV bytes; one after the other, as a layer runs them, they sum to the serial floor (>= floor_ms)
    gemm_floor_ms = max(weight_bytes(llm) / bw, linear_flops(llm, batch) / gemm_rate if gemm_rate else 0.0) * 1e3
    attention_floor_ms = cached * kv_bytes_per_token(llm) / bw * 1e3
    config = "cache-on-fp8" if llm.runner.kv_dtype.value.startswith("fp8") else f"cache-on-{llm.runner.kv_dtype.value}"
    return full_row(dict(workload="decode-sweep", config=config, batch=batch,
                graphs=graphs, sampled=not params.greedy, async_scheduling=overlap,
                steps_ahead=llm.core.steps_ahead - ahead0, step_ms=round(ms, 3), floor_ms=round(floor_ms, 3),
                bytes_floor_ms=round(bytes_floor_ms, 3),
                compute_floor_ms=None if compute_floor_ms is None else round(compute_floor_ms, 3),
                fraction_of_floor=round(floor_ms / ms, 3), output_tokens_per_s=round(batch / ms * 1e3, 1),
                steps_timed=len(steps), max_concurrency=batch, pool_pages=llm.num_pages,
                fused_decode_rows=llm.runner.model.fused_decode_rows,
                gemm_floor_ms=round(gemm_floor_ms, 3), attention_floor_ms=round(attention_floor_ms, 3),
                serial_floor_ms=round(gemm_floor_ms + attention_floor_ms, 3),
                **dict(zip(("kernels_per_step", "idle_us_per_step"),
                           device_gaps(prof, profiled) if prof is not None else (None, None))),
                **(phase_times(prof, profiled) if prof is not None else {})))


# ---------------------------------------------------------------- Part B: workloads

ROW_KEYS = ("workload", "config", "batch", "step_ms", "floor_ms", "output_tokens_per_s", "requests_per_s",
            "ttft_p50_s", "ttft_p99_s", "hit_rate", "peak_pages", "pool_pages", "cpu_frac_per_step",
            "max_concurrency")
WORKLOADS = ("few-shot", "multi-turn", "trace", "no-sharing")
CONFIGS = ("default", "cache-on-bf16", "cache-off-bf16", "cache-on-fp8", "cache-on-bf16-cascade", "cache-on-int4", "cache-on-int4-nosink",
           "cache-on-int4-nowindow", "hf-generate")
HF_WORKLOADS = ("few-shot", "no-sharing")  # static prompt lists: what a batched generate() serves


def full_row(row: dict) -> dict:
    """The issue's keys first (None where they do not apply), then the row's own extras."""
    return {**{k: row.get(k) for k in ROW_KEYS}, **row}


@dataclass(frozen=True)
class Sizes:
    """Part B sizes (flags override); full = the H200 run (~6-8 min), smoke = tiny CPU shapes."""

    fs_prompts: int = 512  # few-shot questions (GSM8K test), spread over fs_templates example sets
    fs_shots: int = 8
    fs_templates: int = 4
    new: int = 64  # output tokens of few-shot and no-sharing requests
    ns_prompts: int = 512
    ns_len: int = 512
    mt_sessions: int = 64
    mt_turns: int = 4
    mt_system: int = 256  # tokens of the system prompt all sessions share
    mt_max_user: int = 512  # a user turn's tokens are capped here (ShareGPT pastes can be huge)
    mt_max_reply: int = 128  # a reply's max_tokens is capped here (the turns run one after another)
    trace_requests: int = 500
    trace_speedup: float = 20.0  # wall-clock arrival = trace arrival_s / speedup
    trace_max_prompt: int = 2048  # longer prompts are truncated (their shared prefix blocks kept)
    trace_max_new: int = 128
    hf_batch: int = 64
    hf_requests: int = 128  # prompts of each workload timed through transformers' generate
    kv_gb: float = 64.0  # KV byte budget of every engine config (fp8 gets the pages it buys)


SMOKE = Sizes(fs_prompts=16, fs_shots=2, new=8, ns_prompts=16, ns_len=64, mt_sessions=6, mt_system=32,
              mt_max_user=32, mt_max_reply=8, trace_requests=40, trace_speedup=200.0, trace_max_prompt=256,
              trace_max_new=8, hf_batch=4, hf_requests=8, kv_gb=0.0)
SMOKE_PAGES = 4096  # bf16 pages of the smoke run's pool (kv_gb 0)


class _Timed:
    """Wraps a scheduler method, adding its wall time to `total` (CPU time of scheduler + tree)."""

    def __init__(self, fn: Any) -> None:
        self.fn, self.total = fn, 0.0

    def __call__(self, *args: Any) -> Any:
        t = time.perf_counter()
        try:
            return self.fn(*args)
        finally:
            self.total += time.perf_counter() - t


class Arrival(NamedTuple):
    due_s: float  # wall-clock seconds after the start at which the request is sent
    prompt: list[int]
    max_tokens: int
    key: Any = None  # handed to `follow` when the request finishes


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(len(xs) * q))], 4)


def run_workload(llm: LLM, name: str, config: str, arrivals: list[Arrival],
                 follow: Callable[[Request, Any], Arrival | None] | None = None, **extra: Any) -> dict:
    """Send each request when its time comes (add_requests between steps) and step to the end.

    follow(req, key): called as a request finishes; an Arrival it returns is sent at once (a
    conversation's next turn). TTFT = first token's time after the request was sent."""
    llm.reset_prefix_cache()
    sched = llm.core.scheduler
    schedule, update = _Timed(sched.schedule), _Timed(sched.update)
    sched.schedule, sched.update = schedule, update
    m0 = (sched.metrics.prompt_tokens, sched.metrics.hit_tokens)
    c0 = llm.runner.attention.cascade_steps  # decode steps through the cascade kernels (cascade=True)
    g0 = llm.runner.graphs.num_graphs if llm.runner.graphs is not None else 0
    win = llm.runner.attention.window  # the recent-token window (int4 by default): pages filled by dequantising
    f0 = win.fills if win is not None else 0
    pending = deque(sorted(arrivals, key=lambda a: a.due_s))
    sent: dict[int, tuple[float, Any]] = {}  # rid -> (time sent, key)
    no_token: list[Request] = []  # sent, no output token yet
    ttft: list[float] = []
    out_tokens = done = steps = peak = concurrency = 0

    def send(items: list[Arrival], now: float) -> None:
        reqs = llm.add_requests([a.prompt for a in items],
                                [SamplingParams(temperature=0.0, max_tokens=a.max_tokens, ignore_eos=True)
                                 for a in items])
        for r, a in zip(reqs, items):
            sent[r.rid] = (now, a.key)
        no_token.extend(reqs)

    sync(llm.runner.device)
    t0 = time.perf_counter()
    try:
        while pending or llm.has_work():
            now = time.perf_counter() - t0
            due = []
            while pending and pending[0].due_s <= now:
                due.append(pending.popleft())
            if due:
                send(due, now)
            if not llm.has_work():
                time.sleep(max(0.0, pending[0].due_s - now))
                continue
            finished = llm.step()
            steps += 1
            now = time.perf_counter() - t0
            if no_token:
                still = []
                for r in no_token:
                    if r.output:
                        ttft.append(now - sent[r.rid][0])
                    else:
                        still.append(r)
                no_token = still
            peak = max(peak, llm.core.pool.num_used)
            concurrency = max(concurrency, sched.num_running)
            nxt = []
            for r in finished:
                out_tokens += len(r.output)
                done += 1
                key = sent.pop(r.rid)[1]
                a = follow(r, key) if follow is not None else None
                if a is not None:
                    nxt.append(a)
            if nxt:
                send(nxt, now)
    finally:
        del sched.schedule, sched.update  # back to the class's methods
    wall = time.perf_counter() - t0
    prompt_tokens = sched.metrics.prompt_tokens - m0[0]
    return full_row(dict(
        workload=name, config=config, requests=done, wall_s=round(wall, 3), steps=steps,
        step_ms=round(wall / max(1, steps) * 1e3, 3), output_tokens=out_tokens,
        output_tokens_per_s=round(out_tokens / wall, 1), requests_per_s=round(done / wall, 2),
        ttft_p50_s=_pct(ttft, 0.5), ttft_p99_s=_pct(ttft, 0.99),
        hit_rate=round((sched.metrics.hit_tokens - m0[1]) / max(1, prompt_tokens), 4), prompt_tokens=prompt_tokens,
        peak_pages=peak, pool_pages=llm.num_pages, cpu_frac_per_step=round((schedule.total + update.total) / wall, 4),
        max_concurrency=concurrency, cascade_steps=llm.runner.attention.cascade_steps - c0,
        graphs_captured=(llm.runner.graphs.num_graphs if llm.runner.graphs is not None else 0) - g0,
        window_fills=win.fills - f0 if win is not None else None, **extra))


def _fold(tokens: Any, vocab: int) -> list[int]:
    """Synthetic / hashed token ids into [3, vocab) (ids 0..2 are often special)."""
    return (3 + np.asarray(tokens, dtype=np.int64) % (vocab - 3)).tolist()


def multi_turn_sessions(sz: Sizes, vocab: int, sharegpt: str | None) -> tuple[list[int], list[list[tuple[list[int], int]]], str]:
    """(system tokens, per session [(user tokens, reply max_tokens)] per turn, where the shapes came from).

    With a ShareGPT file: the first sessions with >= mt_turns human/gpt pairs give the turn lengths
    (tokens ~ bytes / 4); without: workloads/multi_turn.py's generator (exponential lengths)."""
    from radixkv.workloads import random_tokens
    from radixkv.workloads.multi_turn import MultiTurnConfig, multi_turn, session_turns, sharegpt_turn_lengths

    if sharegpt:
        shapes = [s for s in sharegpt_turn_lengths(sharegpt, 10**9, sz.mt_turns) if len(s) >= sz.mt_turns]
        shapes = shapes[:sz.mt_sessions]
        rng = np.random.default_rng(0)
        system = random_tokens(rng, sz.mt_system)
        sessions = [[(random_tokens(rng, min(u, sz.mt_max_user)), min(r, sz.mt_max_reply)) for u, r in s]
                    for s in shapes]
        source = f"sharegpt:{Path(sharegpt).name}"
    else:
        cfg = MultiTurnConfig(sessions=sz.mt_sessions, max_turns=sz.mt_turns, system_len=sz.mt_system,
                              max_reply=sz.mt_max_reply, rate=float("inf"), think_s=0.0)
        groups = session_turns(multi_turn(cfg))
        system = next(iter(groups.values()))[0].prompt[:sz.mt_system]
        sessions = []
        for turns in groups.values():
            s, prev = [], sz.mt_system  # the generator's history: prompt + its drawn reply
            for r in turns:
                s.append((r.prompt[prev:][:sz.mt_max_user], r.max_tokens))
                prev = len(r.prompt) + r.max_tokens
            sessions.append(s)
        source = "synthetic (workloads/multi_turn.py)"
    return (_fold(system, vocab), [[(_fold(u, vocab), n) for u, n in s] for s in sessions], source)


def trace_arrivals(sz: Sizes, vocab: int, max_len: int) -> tuple[list[Arrival], dict]:
    """The first trace_requests of the bundled Mooncake synthetic trace, arrivals / speedup,
    prompts truncated to trace_max_prompt (and to what the context holds), outputs to trace_max_new."""
    from radixkv.workloads.data import bundled_trace
    from radixkv.workloads.traces import read_mooncake

    reqs = read_mooncake(bundled_trace("mooncake-synthetic")).requests[:sz.trace_requests]
    cap = min(sz.trace_max_prompt, max_len - sz.trace_max_new)
    out, truncated, t_first = [], 0, reqs[0].arrival_s
    for r in reqs:
        tokens = r.tokens()
        truncated += len(tokens) > cap
        out.append(Arrival((r.arrival_s - t_first) / sz.trace_speedup, _fold(tokens[:cap], vocab),
                           min(r.max_tokens, sz.trace_max_new)))
    info = dict(truncated=truncated, max_prompt=cap, speedup=sz.trace_speedup,
                arrival_span_s=round(out[-1].due_s, 2), trace="mooncake-synthetic")
    return out, info


class Inputs(NamedTuple):
    few_shot: list[list[int]]
    unique: list[list[int]]
    system: list[int]
    sessions: list[list[tuple[list[int], int]]]
    mt_source: str
    trace: list[Arrival]
    trace_info: dict


def build_inputs(sz: Sizes, vocab: int, max_len: int, gsm8k: str | None, sharegpt: str | None,
                 only: set[str]) -> Inputs:
    from radixkv.engine.bench import few_shot_prompts

    fs = (few_shot_prompts(vocab, sz.fs_shots, sz.fs_prompts // sz.fs_templates, sz.new, gsm8k,
                           templates=sz.fs_templates) if "few-shot" in only else [])
    g = torch.Generator().manual_seed(3)
    unique = [torch.randint(3, vocab, (sz.ns_len,), generator=g).tolist() for _ in range(sz.ns_prompts)]
    system, sessions, source = (multi_turn_sessions(sz, vocab, sharegpt) if "multi-turn" in only
                                else ([], [], ""))
    trace, info = trace_arrivals(sz, vocab, max_len) if "trace" in only else ([], {})
    return Inputs(fs, unique, system, sessions, source, trace, info)


def run_engine_workload(llm: LLM, name: str, config: str, inp: Inputs, sz: Sizes) -> dict:
    if name == "few-shot":
        return run_workload(llm, name, config, [Arrival(0.0, p, sz.new) for p in inp.few_shot],
                            shots=sz.fs_shots, templates=sz.fs_templates)
    if name == "no-sharing":
        return run_workload(llm, name, config, [Arrival(0.0, p, sz.new) for p in inp.unique], prompt_len=sz.ns_len)
    if name == "multi-turn":
        first = [Arrival(0.0, inp.system + s[0][0], s[0][1], (i, 0)) for i, s in enumerate(inp.sessions)]

        def follow(r: Request, key: tuple[int, int]) -> Arrival | None:
            i, k = key
            turns = inp.sessions[i]
            if k + 1 == len(turns):
                return None
            user, reply = turns[k + 1]  # the whole conversation so far is sent again, then the new turn
            return Arrival(0.0, list(r.prompt) + list(r.output) + user, reply, (i, k + 1))

        return run_workload(llm, name, config, first, follow, sessions=len(inp.sessions),
                            turns=sz.mt_turns, shapes=inp.mt_source)
    if name == "trace":
        return run_workload(llm, name, config, inp.trace, **inp.trace_info)
    raise ValueError(name)


def hf_generate_row(cfg: Any, device: torch.device, name: str, prompts: list[list[int]], new: int,
                    batch: int, seed: int = 0) -> dict:
    """transformers' batched generate: left-padded batches, greedy, exactly `new` tokens each.

    The model is built as the engine builds its random weights (same initialiser, seed and dtype:
    radixkv.engine.weights.random_checkpoint), so both serve the same network."""
    from transformers import AutoModelForCausalLM

    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.eval()
    model.generation_config.eos_token_id = model.config.eos_token_id = None  # EOS an ordinary token

    def gen(chunk: list[list[int]], n: int) -> int:
        L = max(map(len, chunk))
        ids = torch.zeros(len(chunk), L, dtype=torch.long)
        mask = torch.zeros(len(chunk), L, dtype=torch.long)
        for j, p in enumerate(chunk):
            ids[j, L - len(p):] = torch.tensor(p)
            mask[j, L - len(p):] = 1
        with torch.inference_mode():
            out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), max_new_tokens=n,
                                 do_sample=False, pad_token_id=0)
        return (out.shape[1] - L) * len(chunk)

    gen([p[:32] for p in prompts[:2]], 2)  # warm-up
    oom = 0
    while True:
        try:
            sync(device)
            t0 = time.perf_counter()
            out_tokens = sum(gen(prompts[i:i + batch], new) for i in range(0, len(prompts), batch))
            sync(device)
            wall = time.perf_counter() - t0
            break
        except torch.cuda.OutOfMemoryError:  # the whole subset again, in half the batch
            if batch == 1:
                raise
            batch, oom = batch // 2, oom + 1
            torch.cuda.empty_cache()
    return full_row(dict(workload=name, config="hf-generate", requests=len(prompts), wall_s=round(wall, 3),
                         output_tokens=out_tokens, output_tokens_per_s=round(out_tokens / wall, 1),
                         requests_per_s=round(len(prompts) / wall, 2), max_concurrency=batch, hf_batch=batch,
                         oom_retries=oom, subset=True))


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def workloads_part(device: torch.device, a: argparse.Namespace, emit: Any, done: set[tuple[str, str]]) -> None:
    """Part B: few-shot, multi-turn, trace, no-sharing; cache on / off in bf16, cache on in fp8_e4m3
    at the same KV byte budget, transformers' generate. (workload, config) pairs in `done` are skipped."""
    from radixkv.engine.kv_store import KVStore

    sz = a.sizes
    cfg = llama3_8b_config(a.smoke)
    only = [w for w in WORKLOADS if w in a.only]
    configs = [c for c in CONFIGS if c in a.configs]
    todo = {(w, c) for w in only for c in configs if (w, c) not in done
            and (c != "hf-generate" or w in HF_WORKLOADS)}
    if not todo:
        print("Part B: every selected (workload, config) row is already in the JSON")
        return
    vocab = cfg.vocab_size
    inp = build_inputs(sz, vocab, cfg.max_position_embeddings, a.gsm8k, a.sharegpt, {w for w, _ in todo})
    L, H, D = cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads
    budget = (SMOKE_PAGES * KVStore.bytes_per_page(16, L, H, D, "bfloat16") if sz.kv_gb <= 0
              else int(sz.kv_gb * 1e9))
    for config in configs:
        names = [w for w in only if (w, config) in todo]
        if not names:
            continue
        if config == "hf-generate":
            for w in names:
                prompts = (inp.few_shot if w == "few-shot" else inp.unique)[:sz.hf_requests]
                emit(hf_generate_row(cfg, device, w, prompts, sz.new, sz.hf_batch))
                _free(device)
            continue
        kw: dict[str, Any] = {"cache-off-bf16": dict(enable_prefix_caching=False),
                              "cache-on-fp8": dict(kv_dtype="fp8_e4m3"),
                              "cache-on-bf16-cascade": dict(cascade=True),
                              "cache-on-int4": dict(kv_dtype="int4"),  # its default window of 16 and sink of 16
                              "cache-on-int4-nosink": dict(kv_dtype="int4", kv_sink=0),
                              "cache-on-int4-nowindow": dict(kv_dtype="int4", kv_window=0)}.get(config, {})
        if config == "default":  # the engine's own pool size and settings (issue 31: "default settings")
            num_pages = None
        else:
            num_pages = KVStore.pages_for_budget(budget, 16, L, H, D, kw.get("kv_dtype", "bfloat16"))
        t = time.perf_counter()
        llm = LLM(cfg, dtype="bfloat16", device=device, **({} if num_pages is None else dict(num_pages=num_pages)), **kw)
        num_pages = llm.num_pages
        # warm-up: Triton compiles each prefill tile config on first use; graphs are captured at start-up
        g = torch.Generator().manual_seed(5)
        lens = {len(inp.few_shot[0]) if inp.few_shot else 1024, 40, 100, sz.ns_len, sz.trace_max_prompt}
        warm = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in sorted(lens) for _ in range(2)]
        llm.generate(warm, SamplingParams(temperature=0.0, max_tokens=sz.new, ignore_eos=True))
        llm.generate([w[:-3] + [5, 6, 7] for w in warm], SamplingParams(temperature=0.0, max_tokens=4,
                                                                          ignore_eos=True))  # cached-prefix extends
        warm_shared_prefix(llm, vocab, g)
        graphs = llm.runner.graphs.num_graphs if llm.runner.graphs is not None else 0
        print(f"# {config}: built and warmed in {time.perf_counter() - t:.1f} s, {num_pages} pages, "
              f"{graphs} graphs", flush=True)
        for w in names:
            emit(run_engine_workload(llm, w, config, inp, sz))
        del llm
        _free(device)


def warm_shared_prefix(llm: LLM, vocab: int, g: torch.Generator) -> None:
    """Every config's same warm-up batch that cascade=True runs as cascade steps (the 16-bit rule's floor:
    64 rows sharing 1024 tokens), so no config's first such steps (a compile, a capture) land in a timed
    run; LLM(cascade=True) captures its cascade graphs at start-up too, so this normally finds them."""
    from radixkv.scheduler.cascade_groups import CASCADE_MIN_ROWS_16BIT, CASCADE_MIN_SHARED_TOKENS_16BIT

    shared = torch.randint(3, vocab, (CASCADE_MIN_SHARED_TOKENS_16BIT,), generator=g).tolist()
    llm.generate([shared], SamplingParams(temperature=0.0, max_tokens=1))  # the prefix enters the tree
    c0 = llm.runner.attention.cascade_steps
    llm.generate([shared + torch.randint(3, vocab, (8,), generator=g).tolist() for _ in range(CASCADE_MIN_ROWS_16BIT)],
                 SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    if llm.config.scheduler.cascade and not llm.runner.kv_dtype.is_int:
        print(f"#   warm-up cascade steps: {llm.runner.attention.cascade_steps - c0}", flush=True)
    llm.reset_prefix_cache()


def profile_steps(llm: LLM, batch: int, prompt: int, out: str | None, sampled: bool = False,
                  steps: int = 12) -> None:
    """torch.profiler over `steps` decode steps of `batch` rows: the top ops by CPU and by GPU time."""
    from torch.profiler import ProfilerActivity, profile

    g = torch.Generator().manual_seed(7)
    reqs = llm.add_requests([torch.randint(3, llm.runner.spec.vocab_size, (prompt,), generator=g).tolist()
                             for _ in range(batch)], SamplingParams(temperature=0.8 if sampled else 0.0, top_p=0.95,
                                                                     max_tokens=16 + steps, ignore_eos=True))
    while not all(r.num_computed >= len(r.prompt) for r in reqs):
        llm.step()
    for _ in range(4):
        llm.step()  # graphs captured
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if llm.runner.device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(steps):
            llm.step()
    while llm.has_work():
        llm.step()
    llm.reset_prefix_cache()
    text = [f"== batch {batch}, {steps} decode steps, graphs {llm.runner.graphs is not None}, sampled {sampled}"]
    text.append(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18))
    if llm.runner.device.type == "cuda":
        text.append(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=12))
    print("\n".join(text))
    if out:
        with open(out, "a") as f:
            f.write("\n".join(text) + "\n")


def part_a(device: torch.device, a: argparse.Namespace, rows: list[dict], emit: Any) -> None:
    """Checks, then the decode sweep; rows already in the JSON (same check / same sweep point) are kept."""
    have_checks = {r["check"] for r in rows if "check" in r}
    swept = {(r["config"], r["batch"], r["graphs"], r["sampled"], r.get("async_scheduling", False))
             for r in rows if r.get("workload") == "decode-sweep"}
    if not a.skip_checks:
        if "gumbel_argmax == twin" not in have_checks:
            emit(check_sampler(device, a.smoke))
        if "async == sync" not in have_checks:
            emit(check_async_equals_sync(device, a.smoke))
        for kv in ("auto", "fp8_e4m3"):
            if f"graph == eager ({kv})" not in have_checks:
                emit(check_graph_equals_eager(device, kv, a.smoke))
        if "graph == eager (auto), tall path, 40 rows" not in have_checks:
            emit(check_graph_equals_eager(device, "auto", a.smoke, tall=True))
    batches = [int(b) for b in a.batches.split(",")]
    graphs_on = device.type == "cuda"  # LLM captures graphs on CUDA (Triton) unless enforce_eager
    # (batch, graphs, sampled, async): graphs with async scheduling on and off, eager without
    modes = ((True, True), (True, False), (False, False))[:1 if a.async_only else 3 - a.no_eager]
    points = [(b, gr, False, ov) for b in batches for gr, ov in (modes if graphs_on else ((False, False),))]
    sampled_async = ((True,) if a.async_only else (True, False)) if graphs_on else (False,)
    points += [(64, graphs_on, True, ov) for ov in sampled_async] if 64 in batches else []
    points = [p for p in points if ("cache-on-bf16", *p) not in swept]
    if not points and not a.profile:
        print("Part A: every decode-sweep row is already in the JSON")
        return
    bw = read_bandwidth(device, a.smoke)
    emit(dict(check="streaming read", tb_per_s=round(bw / 1e12, 3)))
    rate = dense_gemm_rate(device, a.smoke)
    emit(dict(check="dense bf16 GEMM", tflops=round(rate / 1e12, 1)))
    prompt = 32 if a.smoke else a.prompt
    per_row = -(-(prompt + 128) // 16) + 1
    llm = LLM(llama3_8b_config(a.smoke), dtype="bfloat16", device=device, num_pages=max(batches) * per_row + 64)
    emit(dict(check="8B model", weight_gb=round(weight_bytes(llm) / 1e9, 3), pool_pages=llm.num_pages,
              graphs=llm.runner.graphs is not None))
    for b, graphs, sampled, overlap in points:
        if graphs and llm.runner.graphs is None:
            continue
        emit(decode_sweep(llm, b, prompt, SAMPLED if sampled else GREEDY, graphs, bw, a.smoke, overlap, rate))
    if a.profile:
        for b, sampled in ((1, False), (256, False), (64, True)):
            profile_steps(llm, b, prompt, a.profile, sampled)
    del llm
    _free(device)


def long_decode(device: torch.device, a: argparse.Namespace, rows: list[dict], emit: Any) -> None:
    """bf16 against fp8_e4m3 KV on one long-context decode point (--long-decode BATCH:PROMPT, graphs,
    greedy), each in its own pool sized for it: the issue's "FP8 decode faster than bf16" at the
    largest batch x context whose bf16 KV fits beside the weights (256 x 4k needs ~140 GB)."""
    batch, prompt = (int(x) for x in a.long_decode.split(":"))
    done = {r["config"] for r in rows if r.get("workload") == "decode-long" and r.get("prompt") == prompt
            and r.get("batch") == batch}
    bw = read_bandwidth(device, a.smoke)
    for kv in ("auto", "fp8_e4m3"):
        config = "cache-on-fp8" if kv.startswith("fp8") else "cache-on-bf16"
        if config in done:
            continue
        llm = LLM(llama3_8b_config(a.smoke), dtype="bfloat16", device=device, kv_dtype=kv,
                  num_pages=batch * (-(-(prompt + 128) // 16) + 1) + 64, max_model_len=prompt + 256)
        row = decode_sweep(llm, batch, prompt, GREEDY, llm.runner.graphs is not None, bw, a.smoke)
        emit({**row, "workload": "decode-long", "prompt": prompt})
        del llm
        _free(device)


def _f(v: Any, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def summary(rows: list[dict]) -> str:
    lines = [f"{'batch':>5} {'config':>14} {'graphs':>6} {'sampled':>7} {'async':>5} {'step ms':>8} {'floor ms':>8} "
             f"{'of floor':>8} {'kernels':>7} {'idle us':>7} {'gemm ms/floor':>13} {'attn ms/floor':>13} "
             f"{'other ms':>8} {'serial floor':>12}"]
    for r in rows:
        if r.get("workload") in ("decode-sweep", "decode-long"):
            phase = [f"{_f(r.get(f'{k}_us_per_step') and r[f'{k}_us_per_step'] / 1e3, '.2f')}/"
                     f"{_f(r.get(f'{k}_floor_ms'), '.2f')}" for k in ("gemm", "attention")]
            lines.append(f"{r['batch']:>5} {r['config']:>14} {str(r['graphs']):>6} {str(r['sampled']):>7} "
                         f"{str(r.get('async_scheduling', False)):>5} "
                         f"{r['step_ms']:>8.2f} {r['floor_ms']:>8.2f} {r['fraction_of_floor']:>8.2f} "
                         f"{_f(r.get('kernels_per_step'), '.1f'):>7} {_f(r.get('idle_us_per_step'), '.0f'):>7} "
                         f"{phase[0]:>13} {phase[1]:>13} "
                         f"{_f(r.get('other_us_per_step') and r['other_us_per_step'] / 1e3, '.2f'):>8} "
                         f"{_f(r.get('serial_floor_ms'), '.2f'):>12}")
    lines.append(f"\n{'workload':>10} {'config':>14} {'reqs':>5} {'out tok/s':>10} {'req/s':>7} {'ttft p50':>8} "
                 f"{'ttft p99':>8} {'hit':>6} {'peak/pool':>13} {'cpu frac':>8} {'max conc':>8} {'step ms':>8}")
    order = {w: i for i, w in enumerate(WORKLOADS)}
    for r in sorted((r for r in rows if r.get("workload") in order),
                    key=lambda r: (order[r["workload"]], CONFIGS.index(r["config"]))):
        pp = "-" if r["peak_pages"] is None else f"{r['peak_pages']}/{r['pool_pages']}"
        lines.append(f"{r['workload']:>10} {r['config']:>14} {r.get('requests', 0):>5} "
                     f"{_f(r['output_tokens_per_s'], '.1f'):>10} {_f(r['requests_per_s'], '.2f'):>7} "
                     f"{_f(r['ttft_p50_s'], '.3f'):>8} {_f(r['ttft_p99_s'], '.3f'):>8} {_f(r['hit_rate'], '.3f'):>6} "
                     f"{pp:>13} {_f(r['cpu_frac_per_step'], '.3f'):>8} {_f(r['max_concurrency'], 'd'):>8} "
                     f"{_f(r['step_ms'], '.2f'):>8}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", default=None, help="rows go here; if it exists, rows already in it are kept and skipped")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes (CPU when no GPU): checks the script")
    ap.add_argument("--parts", default="A", help="A (checks + decode sweep), B (workloads) or A,B")
    ap.add_argument("--workloads", action="store_true", help="same as adding B to --parts")
    ap.add_argument("--only", default=",".join(WORKLOADS), help="Part B workloads, comma-separated")
    ap.add_argument("--configs", default=",".join(CONFIGS), help="Part B configs, comma-separated")
    ap.add_argument("--batches", default="1,16,64,256")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--long-decode", default=None, metavar="BATCH:PROMPT",
                    help="also time bf16 against fp8_e4m3 KV decode at this point (e.g. 128:4096)")
    ap.add_argument("--skip-checks", action="store_true")
    ap.add_argument("--no-eager", action="store_true", help="Part A: graph rows only (async scheduling on and off)")
    ap.add_argument("--async-only", action="store_true", help="Part A: graph rows with async scheduling on only")
    ap.add_argument("--gsm8k", default=None, help="GSM8K folder (train.jsonl, test.jsonl) for the few-shot prompts")
    ap.add_argument("--sharegpt", default=None, help="ShareGPT JSONL for the multi-turn lengths (else synthetic)")
    ap.add_argument("--profile", default=None, help="append torch.profiler tables (batch 1, 256; 64 sampled) to this file")
    for f in fields(Sizes):
        ap.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=None,
                        help=f"Part B size (full {f.default}, smoke {getattr(SMOKE, f.name)})")
    a = ap.parse_args()
    parts = {p.strip().upper() for p in a.parts.split(",")} | ({"B"} if a.workloads else set())
    a.only = {w.strip() for w in a.only.split(",")}
    a.configs = {c.strip() for c in a.configs.split(",")}
    for bad, known in ((a.only - set(WORKLOADS), WORKLOADS), (a.configs - set(CONFIGS), CONFIGS)):
        if bad:
            ap.error(f"unknown {sorted(bad)}; known: {', '.join(known)}")
    base = SMOKE if a.smoke else Sizes()
    a.sizes = replace(base, **{f.name: getattr(a, f.name) for f in fields(Sizes) if getattr(a, f.name) is not None})
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rows: list[dict] = []
    if a.json and Path(a.json).exists():
        rows = json.loads(Path(a.json).read_text())
        print(f"# resuming: {len(rows)} rows already in {a.json}", flush=True)

    def emit(row: dict) -> None:
        rows.append(row)
        print(json.dumps(row), flush=True)
        if a.json:
            Path(a.json).write_text(json.dumps(rows, indent=1) + "\n")

    if "A" in parts:
        part_a(device, a, rows, emit)
    if a.long_decode:
        long_decode(device, a, rows, emit)
    if "B" in parts:
        done = {(r["workload"], r["config"]) for r in rows if r.get("workload") in WORKLOADS}
        workloads_part(device, a, emit, done)
    print("\n" + summary(rows))
    for r in rows:
        if "check" in r:
            print(r)
    return 0 if all(r.get("ok", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
