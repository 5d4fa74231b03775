"""bench_e2e_gpu.py's checks before its sweep: graph == eager (the default paths, or the tall decode path
at 40 rows), async == sync, the fused sampler against its twin. Each returns a row with "check" and "ok"."""
from __future__ import annotations

import contextlib
import os
import time
from typing import Any

import torch
from gpu_engine_check import small_config

from radixkv import LLM, SamplingParams


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA only)."""
    if device.type == "cuda":
        torch.cuda.synchronize()


@contextlib.contextmanager
def fused_decode_rows(value: str):
    """RADIXKV_FUSED_DECODE_ROWS=value for the LLMs built inside (the switch is read once a process)."""
    from radixkv.kernels.dispatch import FUSED_DECODE_ROWS_ENV, fused_decode_rows as switch

    old = os.environ.get(FUSED_DECODE_ROWS_ENV)
    os.environ[FUSED_DECODE_ROWS_ENV] = value
    switch.cache_clear()
    try:
        yield
    finally:
        if old is None:
            del os.environ[FUSED_DECODE_ROWS_ENV]
        else:
            os.environ[FUSED_DECODE_ROWS_ENV] = old
        switch.cache_clear()


def check_graph_equals_eager(device: torch.device, kv: str, smoke: bool, tall: bool = False) -> dict:
    """Same batch through the graph and eagerly: identical logits; then generate with and without. tall:
    40 rows with the tall decode path on (RADIXKV_FUSED_DECODE_ROWS=64: model.decode_rows_tall, split over
    K), counting the eager steps that took it; else 3 rows on the default paths."""
    cfg = small_config("llama", smoke)
    g = torch.Generator().manual_seed(0)
    rows = 40 if tall else 3
    lengths = ((37, 150, 64) * rows)[:rows]
    prompts = [torch.randint(3, cfg.vocab_size, (n,), generator=g).tolist() for n in lengths]
    out: dict[str, Any] = dict(check=f"graph == eager ({kv})" + (", tall path, 40 rows" if tall else ""))
    with fused_decode_rows("64") if tall else contextlib.nullcontext():
        llm = LLM(cfg, dtype="bfloat16", kv_dtype=kv, device=device, num_pages=1024)
        eager = LLM(cfg, dtype="bfloat16", kv_dtype=kv, device=device, num_pages=1024, enforce_eager=True)
    tall_steps = []
    model = eager.runner.model
    model.decode_rows_tall = lambda *a, _f=model.decode_rows_tall: tall_steps.append(1) or _f(*a)
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    a = [o.token_ids for o in llm.generate(prompts, params)]
    b = [o.token_ids for o in eager.generate(prompts, params)]
    out["generate_equal"] = a == b
    out["graph_replays"] = 0 if llm.runner.graphs is None else llm.runner.graphs.replays
    if llm.runner.graphs is not None:  # one decode step, both ways, on the same state
        llm.add_requests(prompts, params)
        while True:
            batch = llm.core.scheduler.schedule(llm.core.now())
            if batch.is_decode_only:
                break
            llm.runner.forward_logits(batch, use_graphs=False)
            llm.core.scheduler.update(batch, [1 if s else None for s in batch.sample], llm.core.now())
        graph = llm.runner.graphs.run(batch).clone()
        ref = llm.runner.forward_logits(batch, use_graphs=False)
        out["logits_bit_identical"] = bool(torch.equal(graph, ref))
        out["logits_max_abs_diff"] = float((graph - ref).abs().max())
        llm.core.scheduler.update(batch, graph.argmax(-1).tolist(), llm.core.now())
    out["tall_steps"] = len(tall_steps)
    out["ok"] = out["generate_equal"] and out.get("logits_bit_identical", True) and (
        not tall or device.type != "cuda" or len(tall_steps) > 0)
    return out


def check_async_equals_sync(device: torch.device, smoke: bool) -> dict:
    """generate with async scheduling on and off: the same tokens for greedy, seeded top-p and stop-token
    requests of mixed lengths (rows that finish early are dropped from the steps scheduled ahead)."""
    cfg = small_config("llama", smoke)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, cfg.vocab_size, (n,), generator=g).tolist() for n in (37, 150, 64, 9, 90, 17)]
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in (24, 5, 40)]
    params += [SamplingParams(temperature=0.8, top_p=0.9, seed=7, max_tokens=30, ignore_eos=True),
               SamplingParams(temperature=0.0, max_tokens=30, stop_token_ids=[int(prompts[4][3])]),
               SamplingParams(temperature=1.0, seed=3, max_tokens=12, ignore_eos=True)]
    outs, ahead = [], []
    for overlap in (True, False):
        llm = LLM(cfg, dtype="bfloat16", device=device, num_pages=512, async_scheduling=overlap)
        outs.append([o.token_ids for o in llm.generate(prompts, params)])
        ahead.append(llm.core.steps_ahead)
        del llm
    return dict(check="async == sync", tokens_equal=outs[0] == outs[1], steps_ahead=ahead[0],
                ok=outs[0] == outs[1] and ahead[0] > 0 and ahead[1] == 0)


def check_sampler(device: torch.device, smoke: bool) -> dict:
    """The fused Gumbel-max kernel against its twin on this device: same tokens; time of each."""
    from radixkv import kernels
    from radixkv.kernels.reference_sampling import gumbel_argmax_ref

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
            sync(device)
            t = time.perf_counter()
            for _ in range(20):
                fn(x, inv, seed, ctr)
            sync(device)
            out[f"{name}_us_S{S}"] = round((time.perf_counter() - t) / 20 * 1e6, 1)
    out["ok"] = same
    return out
