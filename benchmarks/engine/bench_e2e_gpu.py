"""End-to-end engine benchmark for the GPU: checks first, then the decode sweep against the floor.

    python benchmarks/engine/bench_e2e_gpu.py --json OUT.json            # on the H200, one call
    python benchmarks/engine/bench_e2e_gpu.py --smoke                    # tiny shapes, CPU: checks the script

1. Checks (small random Llama, bf16 and fp8_e4m3 KV): a decode step replayed from a CUDA graph
   gives the same logits as the eager step on the same batch (bit for bit), and greedy generate
   with graphs equals generate with enforce_eager=True.
2. Decode sweep (Part A): a Llama-3-8B-shaped model (random bf16 weights built from a config),
   batch 1/16/64/256 at prompt 512 + 128 new tokens. Each row: the median wall time of a whole
   `LLM.step()` (scheduling, planning, forward, sampling, update), with CUDA graphs and eager,
   against the floor = (weight bytes + KV bytes read) / streaming-read bandwidth measured in the
   same run. Sampled decoding (temperature 0.8, top_p 0.95) at batch 64 beside greedy.
Rows go to --json (a list of objects, keys as benchmarks/results/e2e.json) and a table last.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from gpu_engine_check import llama3_8b_config, small_config  # noqa: E402

from radixkv import LLM, SamplingParams  # noqa: E402

GREEDY = SamplingParams(temperature=0.0, max_tokens=128, ignore_eos=True)
SAMPLED = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=128, ignore_eos=True)


def read_bandwidth(device: torch.device, smoke: bool) -> float:
    """Streaming-read bandwidth in bytes/s: the best of several sums over a 4 GiB bf16 tensor."""
    n = (1 << 20) if smoke else (2 << 30)
    x = torch.ones(n, dtype=torch.bfloat16, device=device)
    best = float("inf")
    for _ in range(3 if smoke else 10):
        _sync(device)
        t = time.perf_counter()
        x.sum(dtype=torch.float32)
        _sync(device)
        best = min(best, time.perf_counter() - t)
    del x
    return 2 * n / best


def weight_bytes(llm: LLM) -> int:
    """Bytes a decode step reads of the weights: every layer, the final norm and the LM head."""
    m = llm.model
    layer = sum(t.numel() * t.element_size() for L in m.layers for t in vars(L).values()
                if isinstance(t, torch.Tensor))
    return layer + m.norm.numel() * m.norm.element_size() + m.lm_head.numel() * m.lm_head.element_size()


def kv_bytes_per_token(llm: LLM) -> int:
    s = llm.spec
    return llm.kv.bytes_per_page(1, s.num_layers, s.num_kv_heads, s.head_dim, llm.kv_dtype)


def check_graph_equals_eager(device: torch.device, kv: str, smoke: bool) -> dict:
    """Same batch through the graph and eagerly: identical logits; then generate with and without."""
    cfg = small_config("llama", smoke)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, cfg.vocab_size, (n,), generator=g).tolist() for n in (37, 150, 64)]
    out: dict[str, Any] = dict(check=f"graph == eager ({kv})")
    llm = LLM(cfg, dtype="bfloat16", kv_dtype=kv, device=device, num_pages=512)
    eager = LLM(cfg, dtype="bfloat16", kv_dtype=kv, device=device, num_pages=512, enforce_eager=True)
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    a = [o.token_ids for o in llm.generate(prompts, params)]
    b = [o.token_ids for o in eager.generate(prompts, params)]
    out["generate_equal"] = a == b
    out["graph_replays"] = 0 if llm.graphs is None else llm.graphs.replays
    if llm.graphs is not None:  # one decode step, both ways, on the same state
        llm.add_requests(prompts, params)
        while True:
            batch = llm.scheduler.schedule(llm._now())
            if batch.is_decode_only:
                break
            llm.forward_logits(batch, use_graphs=False)
            llm.scheduler.update(batch, [1 if s else None for s in batch.sample], llm._now())
        graph = llm.graphs.run(batch).clone()
        ref = llm.forward_logits(batch, use_graphs=False)
        out["logits_bit_identical"] = bool(torch.equal(graph, ref))
        out["logits_max_abs_diff"] = float((graph - ref).abs().max())
        llm.scheduler.update(batch, graph.argmax(-1).tolist(), llm._now())
    out["ok"] = out["generate_equal"] and out.get("logits_bit_identical", True)
    return out


def check_sampler(device: torch.device, smoke: bool) -> dict:
    """The fused Gumbel-max kernel against its twin on this device: same tokens; time of each."""
    from radixkv import kernels
    from radixkv.kernels.reference import gumbel_argmax_ref

    V = 1000 if smoke else 128256
    out: dict[str, Any] = dict(check="gumbel_argmax == twin", vocab=V)
    same = True
    for S in (1, 4, 64):
        g = torch.Generator(device=device).manual_seed(S)
        x = torch.randn(S, V, generator=g, device=device) * 3
        inv = torch.full((S,), 1 / 0.8, device=device)
        seed = torch.randint(-2**62, 2**62, (S,), generator=g, device=device)
        ctr = torch.randint(0, 4096, (S,), generator=g, device=device)
        fused = kernels.gumbel_argmax if device.type == "cuda" else gumbel_argmax_ref
        a, b = fused(x, inv, seed, ctr), gumbel_argmax_ref(x, inv, seed, ctr)
        same &= bool(torch.equal(a, b))
        for name, fn in (("fused", fused), ("twin", gumbel_argmax_ref)):
            _sync(device)
            t = time.perf_counter()
            for _ in range(20):
                fn(x, inv, seed, ctr)
            _sync(device)
            out[f"{name}_us_S{S}"] = round((time.perf_counter() - t) / 20 * 1e6, 1)
    out["ok"] = same
    return out


def decode_sweep(llm: LLM, batch: int, prompt: int, params: SamplingParams, graphs: bool, bw: float,
                 smoke: bool) -> dict:
    """Median whole-step time of decode-only steps for `batch` rows of `prompt` + up to 128 tokens."""
    saved = llm.graphs
    llm.graphs = saved if graphs else None
    g = torch.Generator().manual_seed(batch)
    reqs = llm.add_requests([torch.randint(3, llm.spec.vocab_size, (prompt,), generator=g).tolist()
                             for _ in range(batch)], params)
    times, ctx = [], []
    with torch.inference_mode():
        while llm.has_work():
            decode = all(r.num_computed >= len(r.prompt) for r in reqs)
            t = time.perf_counter()
            llm.step()
            dt = time.perf_counter() - t
            if decode:
                times.append(dt)
                ctx.append(sum(r.num_tokens for r in reqs))
    llm.graphs = saved
    llm.reset_prefix_cache()
    steps = times[4:] or times  # the first decode steps capture graphs
    ms = statistics.median(steps) * 1e3
    kv_read = statistics.median(ctx[4:] or ctx) * kv_bytes_per_token(llm)
    floor_ms = (weight_bytes(llm) + kv_read) / bw * 1e3
    return dict(workload="decode-sweep", config=f"cache-on-{llm.kv_dtype.value}", batch=batch,
                graphs=graphs, sampled=not params.greedy, step_ms=round(ms, 3), floor_ms=round(floor_ms, 3),
                fraction_of_floor=round(floor_ms / ms, 3), output_tokens_per_s=round(batch / ms * 1e3, 1),
                steps_timed=len(steps))


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


def workload(llm: LLM, name: str, config: str, prompts: list[list[int]], max_tokens: int) -> dict:
    """All prompts arrive at once; step to the end. TTFT = first token's time after arrival."""
    llm.reset_prefix_cache()
    sched = llm.scheduler
    schedule, update = _Timed(sched.schedule), _Timed(sched.update)
    sched.schedule, sched.update = schedule, update
    m0 = (sched.metrics.prompt_tokens, sched.metrics.hit_tokens)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    _sync(llm.device)
    t0 = time.perf_counter()
    reqs = llm.add_requests(prompts, params)
    first: dict[int, float] = {}
    steps = peak = concurrency = 0
    while llm.has_work():
        llm.step()
        steps += 1
        now = time.perf_counter() - t0
        running = [r for r in reqs if r.output]
        for r in running:
            first.setdefault(r.rid, now)
        peak = max(peak, llm.pool.num_used)
        concurrency = max(concurrency, sched.num_running)
    wall = time.perf_counter() - t0
    del sched.schedule, sched.update  # back to the class's methods
    ttft = sorted(first.values())
    prompt_tokens = sched.metrics.prompt_tokens - m0[0]
    return dict(workload=name, config=config, requests=len(prompts), wall_s=round(wall, 3),
                output_tokens_per_s=round(len(prompts) * max_tokens / wall, 1),
                requests_per_s=round(len(prompts) / wall, 2),
                ttft_p50_s=round(ttft[len(ttft) // 2], 3),
                ttft_p99_s=round(ttft[min(len(ttft) - 1, int(len(ttft) * .99))], 3),
                hit_rate=round((sched.metrics.hit_tokens - m0[1]) / max(1, prompt_tokens), 4),
                peak_pages=peak, pool_pages=llm.num_pages, steps=steps,
                cpu_frac_per_step=round((schedule.total + update.total) / wall, 4), max_concurrency=concurrency)


def workloads_part(device: torch.device, gsm8k: str | None, smoke: bool, emit: Any) -> None:
    """Part B: few-shot (k-shot GSM8K prompts sharing their examples) and a no-sharing control,
    cache on / off in bf16 and cache on in fp8_e4m3 at the same KV byte budget."""
    from radixkv.engine.bench import few_shot_prompts

    cfg = llama3_8b_config(smoke)
    n, new = (8, 8) if smoke else (128, 64)
    shots = 2 if smoke else 8
    fs = few_shot_prompts(cfg.vocab_size, shots, n // 4, new, gsm8k, templates=4)
    g = torch.Generator().manual_seed(3)
    unique = [torch.randint(3, cfg.vocab_size, (64 if smoke else 512,), generator=g).tolist() for _ in range(n)]
    pages = (max(map(len, fs)) + new) // 16 * n + 256
    for config, kw in (("cache-on-bf16", {}), ("cache-off-bf16", dict(enable_prefix_caching=False)),
                       ("cache-on-fp8", dict(kv_dtype="fp8_e4m3"))):
        num_pages = pages if "fp8" not in config else 2 * pages  # same KV bytes (scales aside)
        llm = LLM(cfg, dtype="bfloat16", device=device, num_pages=num_pages, **kw)
        # warm-up: Triton compiles each prefill tile config on first use; graphs are captured at start-up
        warm = [torch.randint(3, cfg.vocab_size, (n_tok,), generator=g).tolist()
                for n_tok in (len(fs[0]), len(fs[0]), 40, 100, len(unique[0]))]
        llm.generate(warm, SamplingParams(temperature=0.0, max_tokens=new, ignore_eos=True))
        llm.generate([w[:-3] + [5, 6, 7] for w in warm], SamplingParams(temperature=0.0, max_tokens=4,
                                                                          ignore_eos=True))  # cached-prefix extends
        for name, prompts in (("few-shot", fs), ("no-sharing", unique)):
            emit(workload(llm, name, config, prompts, new))
        del llm
        if device.type == "cuda":
            torch.cuda.empty_cache()


def profile_steps(llm: LLM, batch: int, prompt: int, out: str | None, sampled: bool = False,
                  steps: int = 12) -> None:
    """torch.profiler over `steps` decode steps of `batch` rows: the top ops by CPU and by GPU time."""
    from torch.profiler import ProfilerActivity, profile

    g = torch.Generator().manual_seed(7)
    reqs = llm.add_requests([torch.randint(3, llm.spec.vocab_size, (prompt,), generator=g).tolist()
                             for _ in range(batch)], SamplingParams(temperature=0.8 if sampled else 0.0, top_p=0.95,
                                                                     max_tokens=16 + steps, ignore_eos=True))
    while not all(r.num_computed >= len(r.prompt) for r in reqs):
        llm.step()
    for _ in range(4):
        llm.step()  # graphs captured
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if llm.device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(steps):
            llm.step()
    while llm.has_work():
        llm.step()
    llm.reset_prefix_cache()
    text = [f"== batch {batch}, {steps} decode steps, graphs {llm.graphs is not None}, sampled {sampled}"]
    text.append(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18))
    if llm.device.type == "cuda":
        text.append(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=12))
    print("\n".join(text))
    if out:
        with open(out, "a") as f:
            f.write("\n".join(text) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes (CPU when no GPU): checks the script")
    ap.add_argument("--batches", default="1,16,64,256")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--skip-checks", action="store_true")
    ap.add_argument("--workloads", action="store_true", help="also Part B (few-shot, no-sharing)")
    ap.add_argument("--gsm8k", default=None, help="GSM8K folder (train.jsonl) for the few-shot prompts")
    ap.add_argument("--profile", default=None, help="append torch.profiler tables (batch 1, 256; 64 sampled) to this file")
    a = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rows: list[dict] = []

    def emit(row: dict) -> None:
        rows.append(row)
        print(json.dumps(row), flush=True)
        if a.json:
            Path(a.json).write_text(json.dumps(rows, indent=1) + "\n")

    if not a.skip_checks:
        emit(check_sampler(device, a.smoke))
        for kv in ("auto", "fp8_e4m3"):
            emit(check_graph_equals_eager(device, kv, a.smoke))
    bw = read_bandwidth(device, a.smoke)
    emit(dict(check="streaming read", tb_per_s=round(bw / 1e12, 3)))
    batches = [int(b) for b in a.batches.split(",")]
    prompt = 32 if a.smoke else a.prompt
    per_row = -(-(prompt + 128) // 16) + 1
    llm = LLM(llama3_8b_config(a.smoke), dtype="bfloat16", device=device, num_pages=max(batches) * per_row + 64)
    emit(dict(check="8B model", weight_gb=round(weight_bytes(llm) / 1e9, 3), pool_pages=llm.num_pages,
              graphs=llm.graphs is not None))
    for b in batches:
        for graphs in ((True, False) if llm.graphs is not None else (False,)):
            emit(decode_sweep(llm, b, prompt, GREEDY, graphs, bw, a.smoke))
    if 64 in batches:
        emit(decode_sweep(llm, 64, prompt, SAMPLED, llm.graphs is not None, bw, a.smoke))
    if a.profile:
        for b, sampled in ((1, False), (256, False), (64, True)):
            profile_steps(llm, b, prompt, a.profile, sampled)
    if a.workloads:
        del llm
        if device.type == "cuda":
            torch.cuda.empty_cache()
        workloads_part(device, a.gsm8k, a.smoke, emit)
    print(f"\n{'batch':>5} {'graphs':>6} {'sampled':>7} {'step ms':>8} {'floor ms':>8} {'of floor':>8}")
    for r in rows:
        if r.get("workload") == "decode-sweep":
            print(f"{r['batch']:>5} {str(r['graphs']):>6} {str(r['sampled']):>7} {r['step_ms']:>8.2f} "
                  f"{r['floor_ms']:>8.2f} {r['fraction_of_floor']:>8.2f}")
    print(f"\n{'workload':>10} {'config':>15} {'out tok/s':>10} {'req/s':>7} {'ttft p50':>8} {'hit':>6} "
          f"{'peak/pool':>11} {'cpu frac':>8}")
    for r in rows:
        if r.get("workload") in ("few-shot", "no-sharing"):
            print(f"{r['workload']:>10} {r['config']:>15} {r['output_tokens_per_s']:>10.1f} "
                  f"{r['requests_per_s']:>7.2f} "
                  f"{r['ttft_p50_s']:>8.3f} {r['hit_rate']:>6.3f} {r['peak_pages']:>5}/{r['pool_pages']:<5} "
                  f"{r['cpu_frac_per_step']:>8.3f}")
    for r in rows:
        if "check" in r:
            print(r)
    return 0 if all(r.get("ok", True) for r in rows) else 1


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


if __name__ == "__main__":
    sys.exit(main())
