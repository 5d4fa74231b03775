"""Whole decode steps with and without cascade in the engine (issue 21 item 4), on the H200.

    python benchmarks/kernels/bench_cascade.py --no-flashinfer --kv-dtype bf16 --json /tmp/ck.json
    python benchmarks/engine/bench_cascade_steps.py --kernels /tmp/ck.json --json benchmarks/results/cascade.json
    python benchmarks/engine/bench_cascade_steps.py --smoke      # CPU, tiny model: checks the script

A Llama-3-8B-shaped model (random bf16 weights, page 16). For each (batch, shared, private): one request
caches the shared prefix, then `batch` requests of shared prefix + `private` own tokens are prefilled and
decode `--new` tokens; the median whole `LLM.step()` of the decode steps (scheduling, planning, forward,
sampling, update) is timed with SchedulerConfig.cascade on and off, on the same engine and pool. Both replay
CUDA graphs (cascade steps from graphs keyed by group-count buckets, engine/cascade_inputs.py); a first check
compares greedy tokens of graph and eager cascade steps on a small model. attention_us_* and flashinfer_us are copied from
bench_cascade.py's rows of the same shapes (--kernels, run in the same device call). Writes the issue's
rows (batch, shared_tokens, private_tokens, kv_dtype, attention_us_plain, attention_us_cascade,
attention_speedup, step_ms_plain, step_ms_cascade, flashinfer_us) and prints a table.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from gpu_engine_check import llama3_8b_config, small_config  # noqa: E402

from radixkv import LLM, SamplingParams  # noqa: E402
from radixkv.scheduler.cascade_groups import RULE_ALWAYS  # noqa: E402

PAGE = 16


def step_times(llm: LLM, shared: list[int], batch: int, private: int, new: int, cascade: bool,
               seed: int) -> tuple[float, int]:
    """Median ms of the decode-only steps of `batch` requests (shared + own tokens), and how many steps
    took the cascade path."""
    llm.core.scheduler.config = dataclasses.replace(llm.core.scheduler.config, cascade=cascade)
    g = torch.Generator().manual_seed(seed)
    V = llm.runner.spec.vocab_size
    prime = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    llm.generate([shared + [5]], prime)  # the shared prefix is cached: every row below hits it
    reqs = llm.add_requests([shared + torch.randint(3, V, (private,), generator=g).tolist() for _ in range(batch)],
                            SamplingParams(temperature=0.0, max_tokens=new, ignore_eos=True))
    before = llm.runner.attention.cascade_steps
    times = []
    with torch.inference_mode():
        while llm.has_work():
            decode = all(r.num_computed >= len(r.prompt) for r in reqs)
            t = time.perf_counter()
            llm.step()
            if decode:
                times.append(time.perf_counter() - t)
    assert all(r.cached_tokens >= len(shared) // PAGE * PAGE - PAGE for r in reqs), "the prefix was not shared"
    llm.reset_prefix_cache()
    return statistics.median(times[3:] or times) * 1e3, llm.runner.attention.cascade_steps - before


def check_graphs(dev: torch.device, smoke: bool, kv_dtype: str = "bf16") -> dict:
    """A small random Llama, 3 groups of rows under 2 few-shot-like prefixes plus lone rows: greedy tokens of
    cascade steps from CUDA graphs, cascade steps run eagerly, and plain decode (the cascade rule forced on),
    over kv_dtype pages (FP8: the graphs' prefixes widened to fp16 copies, eager ones too)."""
    cfg = small_config("llama", smoke)
    g = torch.Generator().manual_seed(2)
    shared = [torch.randint(3, cfg.vocab_size, (n,), generator=g).tolist() for n in (256, 96)]
    prompts = [shared[i % 2][: 256 - 64 * (i % 3)] + torch.randint(3, cfg.vocab_size, (5 + i,), generator=g).tolist()
               for i in range(12)] + [torch.randint(3, cfg.vocab_size, (40,), generator=g).tolist()]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    dtype = "bfloat16" if dev.type == "cuda" else "float32"
    outs, replays = {}, {}
    for name, more in (("graphs", {}), ("eager", {"enforce_eager": True}), ("plain", {"cascade": False})):
        llm = LLM(cfg, dtype=dtype, device=dev, num_pages=512, kv_dtype="auto" if kv_dtype == "bf16" else kv_dtype,
                  **{"cascade": True, **more})
        llm.core.scheduler.cascade_rule = RULE_ALWAYS
        llm.generate([p[:-1] for p in prompts], SamplingParams(temperature=0.0, max_tokens=1))  # cache prefixes
        outs[name] = [o.token_ids for o in llm.generate(prompts, params)]
        replays[name] = (llm.runner.attention.cascade_steps, 0 if llm.runner.graphs is None else llm.runner.graphs.cascade_replays)
        del llm
    same = lambda a, b: sum(x == y for p, q in zip(outs[a], outs[b]) for x, y in zip(p, q)) / (24 * len(prompts))  # noqa: E731
    row = {"check": f"cascade graphs ({kv_dtype})", "tokens_graphs_eq_eager": same("graphs", "eager"),
           "tokens_graphs_eq_plain": same("graphs", "plain"), "cascade_steps": replays}
    row["ok"] = (row["tokens_graphs_eq_eager"] >= 0.98 and replays["eager"][0] > 0 and replays["plain"][0] == 0
                 and (dev.type != "cuda" or replays["graphs"][1] > 0))
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--shared", type=int, nargs="+", default=[0, 1024, 4096, 16384],
                    help="shared prefix tokens (0: no sharing, the control: cascade must cost nothing)")
    ap.add_argument("--private", type=int, nargs="+", default=[64, 512])
    ap.add_argument("--new", type=int, default=24, help="decode steps a shape runs")
    ap.add_argument("--kv-dtype", default="bf16", choices=["bf16", "fp8_e4m3"], help="the pages' dtype")
    ap.add_argument("--kernels", default=None, help="bench_cascade.py's --json rows of the same run")
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    if a.smoke:
        a.batch, a.shared, a.private, a.new = [3], [64], [8], 6
    dev = torch.device("cuda" if torch.cuda.is_available() and not a.smoke else "cpu")
    check = check_graphs(dev, a.smoke, a.kv_dtype)
    print(json.dumps(check), flush=True)
    kernels = {}
    if a.kernels and Path(a.kernels).exists():
        kernels = {(r["batch"], r["shared_tokens"], r["private_tokens"], r["kv_dtype"]): r
                   for r in json.loads(Path(a.kernels).read_text())}
    longest = max(a.shared) + max(a.private) + a.new + PAGE
    pages = max(a.shared) // PAGE + 2 + max(a.batch) * (-(-(max(a.private) + a.new + PAGE) // PAGE) + 1)
    llm = LLM(llama3_8b_config(a.smoke), dtype="bfloat16" if dev.type == "cuda" else "float32", device=dev,
              num_pages=pages + 64, max_model_len=longest, cascade=True, max_running=max(a.batch),
              kv_dtype="auto" if a.kv_dtype == "bf16" else a.kv_dtype,
              # every row's prompt in one prefill step, so all rows decode (and finish) together: the batch
              # keeps its bucket over the timed steps (a shrinking batch would capture new graphs then)
              max_batch_tokens=max(a.batch) * (max(a.private) + 1) + 64)
    if a.smoke:  # 3 rows over 64 shared tokens are below the measured rule: take the path anyway
        llm.core.scheduler.cascade_rule = RULE_ALWAYS
    print(f"device {torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'cpu'}; pool {llm.num_pages} pages; "
          f"graphs {llm.runner.graphs is not None}; async {llm.core.async_scheduling}", flush=True)
    rows = []
    g = torch.Generator().manual_seed(0)
    for shared_n in a.shared:
        shared = torch.randint(3, llm.runner.spec.vocab_size, (shared_n,), generator=g).tolist()
        for batch in a.batch:
            for private in a.private:
                plain_ms, n_plain = step_times(llm, shared, batch, private, a.new, False, batch + private)
                before = 0 if llm.runner.graphs is None else llm.runner.graphs.cascade_replays
                cascade_ms, n_cascade = step_times(llm, shared, batch, private, a.new, True, batch + private)
                replays = 0 if llm.runner.graphs is None else llm.runner.graphs.cascade_replays - before
                k = kernels.get((batch, shared_n, private, a.kv_dtype), {})
                r = {"batch": batch, "shared_tokens": shared_n, "private_tokens": private, "kv_dtype": a.kv_dtype,
                     "attention_us_plain": k.get("attention_us_plain"),
                     "attention_us_cascade": k.get("attention_us_cascade"),
                     "attention_speedup": k.get("attention_speedup"),
                     "step_ms_plain": round(plain_ms, 3), "step_ms_cascade": round(cascade_ms, 3),
                     "step_speedup": round(plain_ms / cascade_ms, 3), "flashinfer_us": k.get("flashinfer_us"),
                     "cascade_steps": n_cascade, "plain_cascade_steps": n_plain,
                     "cascade_graph_replays": replays,
                     "rule_takes_it": llm.core.scheduler.cascade_rule.worth_it(batch, shared_n)}
                rows.append(r)
                print(json.dumps(r), flush=True)
                if a.json:
                    Path(a.json).write_text(json.dumps(rows, indent=1) + "\n")
    print(f"\n{'batch':>5} {'shared':>6} {'own':>4} {'attn plain us':>13} {'attn casc us':>12} {'attn x':>6} "
          f"{'step plain ms':>13} {'step casc ms':>12} {'step x':>6}")
    for r in rows:
        print(f"{r['batch']:>5} {r['shared_tokens']:>6} {r['private_tokens']:>4} {str(r['attention_us_plain']):>13} "
              f"{str(r['attention_us_cascade']):>12} {str(r['attention_speedup']):>6} {r['step_ms_plain']:>13.2f} "
              f"{r['step_ms_cascade']:>12.2f} {r['step_speedup']:>6.2f}")
    ok = all((r["cascade_steps"] > 0) == r["rule_takes_it"] and r["plain_cascade_steps"] == 0 for r in rows)
    print("cascade path taken on every shape the KV dtype's rule takes, never on the others or with cascade off:", ok)
    print(check)
    return 0 if ok and check["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
