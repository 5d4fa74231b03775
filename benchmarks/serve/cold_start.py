"""Cold start: the first request of each shape against a freshly started `radixkv serve`, and ten more.

The server starts (its Triton cache in an empty temp folder unless --keep-triton-cache, so no kernel
compiled by an earlier run is found), /health is awaited, and nothing else is sent before the probes.
Then, one request at a time, streaming (bench-serve's client, token-id chunks), for each kind in order:
  fresh_2048     a fresh 2,048-token prompt (random ids, distinct every request)
  cached_prefix  an earlier fresh_2048 prompt (whole, in the prefix cache) + 128 fresh tokens
  fresh_3000     a fresh 3,000-token prompt
  short_37       a fresh 37-token prompt
the first request and then --repeats more of the same shape; TTFT of each (send -> first token chunk).
Rows of cold_start.json (merged by kind): kind, first_ms, steady_median_ms (the median of the repeats),
ratio = first / steady (issue 31's target: <= 2), ready_s (server start -> /health 200), cached_tokens of
the first request (cached_prefix: the hit), model.

H200 (Llama-3-8B shape, random bf16 weights):
    python benchmarks/serve/cold_start.py
CPU smoke (tiny model, shorter prompts, ~30 s):
    python benchmarks/serve/cold_start.py --smoke
"""
from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import sys
import tempfile
import time

from bench_common import (
    LOW_ID,
    Server,
    add_engine_flags,
    add_model_args,
    json_path,
    log_dir,
    merge_rows,
    model_label,
    resolve_model,
    smoke_engine_defaults,
    table,
    token_id_chunks,
)

KINDS = ("fresh_2048", "cached_prefix", "fresh_3000", "short_37")
FULL = dict(fresh_len=2048, long_len=3000, short_len=37, suffix_len=128)
SMOKE = dict(fresh_len=256, long_len=384, short_len=37, suffix_len=32)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(p, "Llama-3's 128,256")
    add_engine_flags(p)
    g = p.add_argument_group("probes (kind names keep the H200 lengths; --smoke shortens the prompts)")
    for k, v in FULL.items():
        g.add_argument("--" + k.replace("_", "-"), type=int, help=f"default {v} (smoke {SMOKE[k]})")
    g.add_argument("--repeats", type=int, default=10, help="requests after the first, per kind (default 10)")
    g.add_argument("--max-tokens", type=int, default=4, help="output tokens a request (default 4)")
    g.add_argument("--prompt-seed", type=int, default=0)
    g.add_argument("--keep-triton-cache", action="store_true",
                   help="leave TRITON_CACHE_DIR as it is (the persistent cache) instead of an empty temp folder")
    g.add_argument("--server-timeout", type=float, default=1800.0, help="seconds to wait for /health")
    p.add_argument("--json", help="rows merge into this file (default benchmarks/results/cold_start.json; "
                                  "--smoke: a temp file)")
    a = p.parse_args()
    for k, v in (SMOKE if a.smoke else FULL).items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    return a


def prompts(a: argparse.Namespace, vocab: int) -> dict[str, list[list[int]]]:
    """Every kind's 1 + repeats prompts; distinct random ids, seeded."""
    rng = random.Random(a.prompt_seed)
    n = 1 + a.repeats

    def ids(k: int) -> list[int]:
        return [rng.randrange(LOW_ID, vocab) for _ in range(k)]

    fresh = [ids(a.fresh_len) for _ in range(n)]
    return {"fresh_2048": fresh,
            "cached_prefix": [p + ids(a.suffix_len) for p in fresh],  # fresh_2048's prompts are in the tree by then
            "fresh_3000": [ids(a.long_len) for _ in range(n)],
            "short_37": [ids(a.short_len) for _ in range(n)]}


async def probe(url: str, work: dict[str, list[list[int]]], max_tokens: int) -> dict[str, list]:
    """Send every prompt, one at a time, in kind order; {kind: [RequestResult]}."""
    from radixkv.serve.bench_client import make_session, send_request
    from radixkv.serve.bench_client import probe as probe_model
    from radixkv.serve.bench_results import BenchConfig, BenchError, BenchRequest

    cfg = BenchConfig(base_url=url, model="bench", ignore_eos=True, temperature=0.0, timeout_s=1800.0)
    out: dict[str, list] = {}
    async with make_session(cfg, 1) as client:
        model = await probe_model(client, cfg)  # GET /v1/models: no engine work
        t0 = time.perf_counter()
        for kind, ps in work.items():
            out[kind] = []
            for i, p in enumerate(ps):
                r = await send_request(client, cfg, model, BenchRequest(p, max_tokens), t0)
                if not r.success:
                    raise BenchError(f"{kind} request {i}: {r.error}")
                out[kind].append(r)
                if i == 0:
                    print(f"  {kind}: first TTFT {r.ttft * 1e3:.1f} ms ({len(p)} prompt tokens, "
                          f"{r.cached_tokens} cached)", flush=True)
    return out


def main() -> int:
    a = parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally that stops the server
    smoke_engine_defaults(a)
    logs = log_dir(a, "cold_start")
    model, vocab = resolve_model(a, logs)
    if not a.keep_triton_cache:  # the server inherits it: nothing compiled before is found
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-", dir=logs)
    print(f"model {model} ({model_label(a, vocab)}); TRITON_CACHE_DIR={os.environ.get('TRITON_CACHE_DIR', '(default)')}; "
          f"logs in {logs}", flush=True)
    work = prompts(a, vocab)

    from radixkv.serve.bench_client import run_async

    server = Server(model, a, logs / "server.log")
    try:
        t = time.perf_counter()
        server.wait_healthy(a.server_timeout)
        ready = time.perf_counter() - t
        print(f"  server healthy after {ready:.1f} s", flush=True)
        with token_id_chunks():
            res = run_async(probe(server.url, work, a.max_tokens))
    finally:
        server.stop()
    rows = []
    for kind in KINDS:
        first, rest = res[kind][0], res[kind][1:]
        steady = statistics.median(r.ttft for r in rest) * 1e3 if rest else None
        rows.append(dict(kind=kind, first_ms=first.ttft * 1e3, steady_median_ms=steady,
                         ratio=first.ttft * 1e3 / steady if steady else None,
                         steady_max_ms=max(r.ttft for r in rest) * 1e3 if rest else None,
                         prompt_tokens=len(work[kind][0]), cached_tokens=first.cached_tokens, repeats=len(rest),
                         ready_s=ready, triton_cache="persistent" if a.keep_triton_cache else "empty",
                         model=model_label(a, vocab), date=time.strftime("%Y-%m-%d %H:%M")))
    out = json_path(a, "cold_start.json")
    merge_rows(out, rows, ("kind",))
    print(f"  {len(rows)} rows merged into {out}\n", flush=True)
    print(table(rows, [("kind", "kind", ""), ("prompt_tokens", "prompt", "d"), ("cached_tokens", "cached", "d"),
                       ("first_ms", "first TTFT ms", ".1f"), ("steady_median_ms", "steady median ms", ".1f"),
                       ("steady_max_ms", "steady max ms", ".1f"), ("ratio", "first/steady", ".2f")]))
    print(f"server ready after {ready:.1f} s; target: first <= 2x steady for every kind: "
          f"{'met' if all(r['ratio'] is not None and r['ratio'] <= 2 for r in rows) else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
