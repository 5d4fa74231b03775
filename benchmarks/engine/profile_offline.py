"""Where an offline workload's wall time goes, step by step: few-shot GSM8K (issue 31's 10x target) or vLLM's
ShareGPT recipe (its 20k target) through `LLM.generate`, per engine config.

    python benchmarks/engine/profile_offline.py --gsm8k .devshare/gsm8k                     # H200
    python benchmarks/engine/profile_offline.py --smoke                                     # CPU: checks the script
    ... --configs default max_num_batched_tokens=8192 --profile-steps 4
    python benchmarks/engine/profile_offline.py --workload sharegpt --profile-steps 3       # H200, .devshare

Llama-3-8B shape, random bf16 weights (`load_format="dummy"`), the few-shot prompts of bench_e2e_gpu.py
(512 questions over 4 8-shot example sets, 64 new tokens, greedy, all sent at once), or sharegpt_offline.py's
1,000 ShareGPT pairs (SmolLM2's 49k vocabulary, temperature 1, ignore_eos). For each config (`default`
or comma-separated LLM keywords): the run's wall time and output tok/s, then its steps by kind (mixed or
decode-only) with their count, seconds and mean ms, and the ms a step spent waiting for the device's tokens
(runner.collect: near 0 means the host, not the GPU, sets the pace); with --profile-steps N, torch.profiler's
top kernels over N mixed steps from the middle of the prefill and N decode-only steps after it; with
--host-profile N, cProfile of N whole steps (engine step plus LLM's output processing) once --host-rows
requests run: where the host's time goes at that batch.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "serve"))
from gpu_engine_check import llama3_8b_config  # noqa: E402
from bench_common import SMOLLM2_VOCAB, fold_ids, sharegpt_file, sharegpt_pairs, smollm2_tokenizer  # noqa: E402
from sharegpt_offline import SMOKE_CAP, config_kwargs  # noqa: E402

from radixkv import LLM, SamplingParams  # noqa: E402
from radixkv.engine.bench import few_shot_prompts  # noqa: E402


def top_kernels(prof: Any, steps: int, n: int = 8) -> list[str]:
    rows = sorted((e for e in prof.key_averages() if e.device_time_total > 0),
                  key=lambda e: e.device_time_total, reverse=True)[:n]
    total = sum(e.device_time_total for e in prof.key_averages() if e.device_time_total > 0)
    out = [f"      device {total / 1e3 / steps:8.2f} ms/step in all"]
    for e in rows:
        out.append(f"      {e.device_time_total / 1e3 / steps:8.3f} ms/step x {e.count / steps:6.1f}  {e.key[:80]}")
    return out


class StepClock:
    """Times every core.step(); profiles N mixed steps from the middle of the prefill and N decode steps."""

    def __init__(self, llm: LLM, profile_steps: int, cuda: bool, host_steps: int = 0, host_rows: int = 768) -> None:
        self.core, self.n, self.cuda = llm.core, profile_steps, cuda
        self.log: list[tuple[bool, int, float, float]] = []  # (mixed, running rows, seconds, of which waiting)
        self.tables: dict[str, list[str]] = {}
        self._step = llm.core.step
        llm.core.step = self._timed
        self._collect, self._runner, self._wait = llm.runner.collect, llm.runner, 0.0
        llm.runner.collect = self._timed_collect
        # cProfile of whole steps (LLM._step: the engine's and the output processing) at >= host_rows running
        self.host_steps, self.host_rows, self.host_table = host_steps, host_rows, []
        self._llm_step = llm._step  # (what generate's loop calls a step)
        if host_steps:
            llm._step = self._host_profiled

    def _timed_collect(self, launched: Any) -> Any:
        t = time.perf_counter()
        out = self._collect(launched)
        self._wait += time.perf_counter() - t
        return out

    def _host_profiled(self) -> Any:
        if self.host_table or len(self.core.scheduler.running) < self.host_rows:
            return self._llm_step()
        pr = cProfile.Profile()
        pr.enable()
        out = [o for _ in range(self.host_steps) for o in self._llm_step()]
        pr.disable()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(16)
        self.host_table = [f"      {ln.strip()[:150]}" for ln in s.getvalue().splitlines()
                           if ln.strip() and (ln.strip()[0].isdigit() or "function calls" in ln)]
        return out

    def restore(self) -> tuple[Any, Any, Any]:
        """The engine's own core.step, runner.collect and LLM._step (to put back), dropping this clock's hold."""
        out = (self._step, self._collect, self._llm_step)
        self.core = self._step = self._collect = self._runner = self._llm_step = None
        return out

    def _profiled(self, kind: str) -> bool:
        return self.n > 0 and kind not in self.tables and (
            (kind == "mixed" and sum(m for m, *_ in self.log) >= 10) or
            (kind == "decode" and len(self.log) > 20 and not self.log[-1][0] and not self.log[-2][0]))

    def _timed(self) -> Any:
        kind = "mixed" if self.log and self.log[-1][0] else "decode"
        if self.cuda and self._profiled(kind):
            from torch.profiler import ProfilerActivity, profile

            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                out = [d for _ in range(self.n) for d in self._one()]  # every step's deltas, in order
                torch.cuda.synchronize()
            rows = [n for _, n, *_ in self.log[-self.n:]]
            self.tables[kind] = [f"      running rows {min(rows)}-{max(rows)}"] + top_kernels(prof, self.n)
            return out
        return self._one()

    def _one(self) -> Any:
        mixed, t, self._wait = self.core.mixed_steps, time.perf_counter(), 0.0
        out = self._step()
        self.log.append((self.core.mixed_steps > mixed, len(self.core.scheduler.running), time.perf_counter() - t,
                         self._wait))
        return out

    def summary(self) -> list[str]:
        out = [f"    {'kind':>7} {'steps':>6} {'seconds':>8} {'ms/step':>8} {'wait ms':>8} {'mean rows':>9}"]
        for name, flag in (("mixed", True), ("decode", False)):
            sel = [(n, s, w) for m, n, s, w in self.log if m == flag]
            if sel:
                secs = sum(s for _, s, _ in sel)
                out.append(f"    {name:>7} {len(sel):>6} {secs:>8.2f} {secs / len(sel) * 1e3:>8.2f} "
                           f"{sum(w for *_, w in sel) / len(sel) * 1e3:>8.2f} {sum(n for n, *_ in sel) / len(sel):>9.1f}")
        for lo, hi in ((0, 64), (64, 256), (256, 512), (512, 768), (768, 1025)):
            sel = [(s, w) for _, n, s, w in self.log if lo <= n < hi]
            if sel:
                out.append(f"    {f'{lo}-{hi - 1}':>7} {len(sel):>6} {sum(s for s, _ in sel):>8.2f} "
                           f"{sum(s for s, _ in sel) / len(sel) * 1e3:>8.2f} {sum(w for _, w in sel) / len(sel) * 1e3:>8.2f}")
        for kind, table in self.tables.items():
            out += [f"    top kernels, {self.n} {kind} steps (profiled: not in the times above' accuracy)"] + table
        if self.host_table:
            out += [f"    host, {self.host_steps} whole steps at >= {self.host_rows} running (cProfile)"] + self.host_table
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", choices=("few-shot", "sharegpt"), default="few-shot")
    ap.add_argument("--configs", nargs="+", default=["default"])
    ap.add_argument("--gsm8k", default=None)
    ap.add_argument("--profile-steps", type=int, default=0)
    ap.add_argument("--host-profile", type=int, default=0, help="cProfile this many whole steps at --host-rows")
    ap.add_argument("--host-rows", type=int, default=768)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    cuda = torch.cuda.is_available()
    folder = Path(tempfile.mkdtemp(prefix="rkv-profile-offline-"))
    cfg = llama3_8b_config(a.smoke)
    if a.workload == "sharegpt":
        cfg.vocab_size = min(cfg.vocab_size, SMOLLM2_VOCAB)
        pairs = sharegpt_pairs(sharegpt_file(None), smollm2_tokenizer(), 32 if a.smoke else 1000)
        cap_in, cap_out = SMOKE_CAP if a.smoke else (None, None)
        prompts = [fold_ids(p[:cap_in], cfg.vocab_size) for p, _ in pairs]
        params = [SamplingParams(temperature=1.0, top_p=1.0, ignore_eos=True, max_tokens=min(n, cap_out or n))
                  for _, n in pairs]
    else:
        prompts = few_shot_prompts(cfg.vocab_size, 2 if a.smoke else 8, 4 if a.smoke else 128,
                                   8 if a.smoke else 64, a.gsm8k, templates=4)
        params = SamplingParams(temperature=0.0, max_tokens=8 if a.smoke else 64, ignore_eos=True)
    (folder / "config.json").write_text(json.dumps(cfg.to_dict()))
    rows = []
    for config in a.configs:
        kw = config_kwargs(config) | ({} if cuda else {"device": "cpu", "dtype": "float32", "num_pages": 2048})
        llm = LLM(str(folder), load_format="dummy", **kw)
        llm.generate([p[:64] for p in prompts[:8]], SamplingParams(max_tokens=4, ignore_eos=True))  # warm-up
        llm.reset_prefix_cache()
        clock = StepClock(llm, a.profile_steps, cuda, a.host_profile, 8 if a.smoke else a.host_rows)
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        outs = llm.generate(prompts, params)
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - t
        n_out = sum(len(o.token_ids) for o in outs)
        row = {"workload": a.workload, "config": config, "requests": len(prompts), "wall_s": round(wall, 3),
               "output_tok_s": round(n_out / wall, 1), "steps": len(clock.log),
               "max_num_seqs": llm.config.scheduler.max_running,
               "max_batch_tokens": llm.config.scheduler.max_batch_tokens}
        rows.append(row)
        print(f"  {config}: {json.dumps(row)}", flush=True)
        print("\n".join(clock.summary()), flush=True)
        llm.core.step, llm.runner.collect, llm._step = clock.restore()
        del llm, outs, clock
        if cuda:
            torch.cuda.empty_cache()
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    print(f"\n{'config':>32} {'wall s':>7} {'out tok/s':>10} {'steps':>6} {'seqs':>5} {'budget':>6}")
    for r in rows:
        print(f"{r['config']:>32} {r['wall_s']:>7.2f} {r['output_tok_s']:>10.1f} {r['steps']:>6} "
              f"{r['max_num_seqs']:>5} {r['max_batch_tokens']:>6}")


if __name__ == "__main__":
    main()
