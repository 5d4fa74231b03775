"""The server at the engine's speed: `radixkv serve` + `radixkv bench-serve` vs one offline `LLM.generate`.

Both sides get the SAME token-id prompts (seeded, ids in [100, vocab)), the same model (seeded random
weights from a config.json unless --model) and the same engine flags. Rows:

* prefix-repetition: --num-prompts requests, each one of --num-prefixes shared --prefix-len prefixes
  plus --suffix-len own tokens, --output-len out (ignore_eos, greedy), all sent at once.
* random: --random-num-prompts requests of --input-len random tokens, --output-len out.
  ratio = server output tok/s (bench-serve, at --concurrency) / offline output tok/s (one generate).
* prefix-repetition-open (diagnostic, server only; its ratio is against offline prefix-repetition): the same
  prompts at concurrency = their number, as the offline engine takes them. Each bench-serve run prints the
  CPU seconds of the API process, the engine-core process and the client: one near the wall time is the
  bottleneck.
* prefix-repetition@RATE: --latency-num-prompts of workload (a)'s mix as Poisson arrivals at --rate:
  the server's ITL p50 and the offline decode step (`llm.step()`, decode only) at the same batch: the
  mean of /metrics `radixkv:num_requests_running` sampled every 0.25 s while the engine was busy (> 0).

The server (127.0.0.1, a free port, output in LOG_DIR/server.log) runs first and is stopped (SIGINT,
SIGTERM, SIGKILL) before the offline engine loads, so each has the whole GPU. bench-serve reads the
prompts as a radixkv trace (--token-id-low 0 --vocab-size VOCAB: ids unchanged). It times ITL on chunks
carrying text; a model without a tokenizer (a config.json) streams none before the end, so the latency
run then goes through this file's streaming client with `return_token_ids: true`.

H200 (Llama-3-8B shape, random bf16 weights; 512 x (8 prefixes of 2,048 + 128) and 256 x 1,024):
    python benchmarks/serve/serve_vs_offline.py --json
CPU smoke (2 cores, about a minute; one torch thread a process, as 2 threads on 2 shared cores slow
small ops several-fold, and more in a main thread than in the server's engine thread):
    OMP_NUM_THREADS=1 python benchmarks/serve/serve_vs_offline.py --tiny-model --device cpu --dtype float32 \
        --num-prompts 64 --num-prefixes 2 --prefix-len 512 --suffix-len 64 --random-num-prompts 32 \
        --input-len 256 --output-len 32 --concurrency 32 --latency-num-prompts 40 --rate 4 --json /tmp/svo.json
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

LLAMA3_8B = dict(architectures=["LlamaForCausalLM"], model_type="llama", num_hidden_layers=32, hidden_size=4096,
                 num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336, vocab_size=128256,
                 max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=500000.0, torch_dtype="bfloat16",
                 bos_token_id=128000, eos_token_id=128001, tie_word_embeddings=False)
TINY = dict(LLAMA3_8B, num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, vocab_size=1024, max_position_embeddings=4096, torch_dtype="float32",
            bos_token_id=1, eos_token_id=2)
LOW_ID = 100
OPEN = "prefix-repetition-open"  # workload (a)'s prompts sent all at once: the server without a closed loop
# engine flags handed unchanged to `radixkv serve` and, as keyword arguments (vLLM's names), to LLM(...)
ENGINE_FLAGS = [("--dtype", str), ("--device", str), ("--kv-cache-dtype", str), ("--block-size", int),
                ("--max-num-seqs", int), ("--num-gpu-blocks-override", int), ("--max-model-len", int),
                ("--max-num-batched-tokens", int), ("--gpu-memory-utilization", float), ("--seed", int)]
ENGINE_SWITCHES = ["--enforce-eager", "--no-enable-prefix-caching"]
SIZES = [("--num-prompts", 512, "prefix-repetition requests"), ("--num-prefixes", 8, "shared prefixes"),
         ("--prefix-len", 2048, "prefix tokens"), ("--suffix-len", 128, "tokens after the prefix"),
         ("--random-num-prompts", 256, "random requests"), ("--input-len", 1024, "random prompts' tokens"),
         ("--output-len", 128, "output tokens, every row"), ("--concurrency", 256, "bench-serve --max-concurrency"),
         ("--rate", 4.0, "latency run: Poisson requests/s"), ("--latency-num-prompts", 200, "latency run's requests")]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="model folder, .gguf or config.json (default: a Llama-3-8B-shaped config.json)")
    p.add_argument("--tiny-model", action="store_true", help="a 2-layer, hidden-64 config.json (CPU smoke runs)")
    p.add_argument("--vocab-size", type=int, help="prompt ids lie in [100, N) (default: the config's vocab_size)")
    for flag, typ in ENGINE_FLAGS:
        p.add_argument(flag, type=typ, help="engine flag, used by both sides")
    for flag in ENGINE_SWITCHES:
        p.add_argument(flag, action="store_true", help="engine flag, used by both sides")
    for flag, default, what in SIZES:
        p.add_argument(flag, type=type(default), default=default, help=f"{what} (default {default:g})")
    p.add_argument("--workloads", default="prefix-repetition,random,latency", help="comma-separated rows to run")
    p.add_argument("--prompt-seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=1, help="run each throughput row N times a side; the median counts")
    p.add_argument("--log-dir", help="server.log and bench-serve's files (default: a temp dir)")
    p.add_argument("--server-timeout", type=float, default=1800.0, help="seconds to wait for GET /health")
    p.add_argument("--json", nargs="?", const="benchmarks/results/serve_vs_offline.json", metavar="OUT",
                   help="write the rows as JSON (default path benchmarks/results/serve_vs_offline.json)")
    return p.parse_args()


# ---------------------------------------------------------------- prompts (identical on both sides)

def make_workloads(a: argparse.Namespace, vocab: int) -> dict[str, list[dict]]:
    """{name: [{"arrival_s", "tokens", "max_tokens"}]}, seeded: the server's trace rows and the offline prompts."""
    rng = random.Random(a.prompt_seed)

    def ids(n: int) -> list[int]:
        return [rng.randrange(LOW_ID, vocab) for _ in range(n)]

    prefixes = [ids(a.prefix_len) for _ in range(a.num_prefixes)]

    def mix(n: int) -> list[list[int]]:
        return [prefixes[rng.randrange(a.num_prefixes)] + ids(a.suffix_len) for _ in range(n)]

    gaps = (rng.expovariate(a.rate) for _ in range(a.latency_num_prompts - 1))
    arrivals = [round(t, 6) for t in itertools.accumulate(gaps, initial=0.0)]
    rows = {"prefix-repetition": [(0.0, p) for p in mix(a.num_prompts)],
            "random": [(0.0, ids(a.input_len)) for _ in range(a.random_num_prompts)],
            "latency": list(zip(arrivals, mix(a.latency_num_prompts))),
            "warmup": [(0.0, ids(a.suffix_len + 16)) for _ in range(4)]}  # shares no prefix with the others
    return {k: [{"arrival_s": t, "tokens": p, "max_tokens": a.output_len} for t, p in v] for k, v in rows.items()}


# ---------------------------------------------------------------- server side

def engine_options(a: argparse.Namespace) -> dict[str, object]:
    """{flag: value} of the engine flags given (switches: True)."""
    flags = [f for f, _ in ENGINE_FLAGS] + ENGINE_SWITCHES
    return {f: v for f in flags if (v := getattr(a, f[2:].replace("-", "_"))) not in (None, False)}


def engine_argv(a: argparse.Namespace) -> list[str]:
    return [x for f, v in engine_options(a).items() for x in ([f] if v is True else [f, str(v)])]


def engine_kwargs(a: argparse.Namespace) -> dict:
    """LLM(...) keyword arguments (vLLM's names, as `radixkv serve` passes them) for the same flags."""
    kw = {f[2:].replace("-", "_"): v for f, v in engine_options(a).items()}
    if kw.pop("no_enable_prefix_caching", False):
        kw["enable_prefix_caching"] = False
    return kw


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url: str, data: bytes | None = None, timeout: float = 10.0) -> bytes:
    with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=timeout) as r:
        return r.read()


class Server:
    """`radixkv serve` in its own process group; `stop()` (also on failure) leaves nothing behind."""

    def __init__(self, model: str, a: argparse.Namespace, log: Path) -> None:
        self.url = f"http://127.0.0.1:{free_port()}"
        cmd = [sys.executable, "-m", "radixkv", "serve", model, "--host", "127.0.0.1", "--port",
               self.url.rsplit(":", 1)[1], "--served-model-name", "bench", "--enable-reset-prefix-cache",
               *engine_argv(a)]
        print("$", " ".join(cmd), f"  (log: {log})", flush=True)
        self.log = log.open("w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"radixkv serve exited with {self.proc.returncode}; see {self.log.name}")
            try:
                http(self.url + "/health", timeout=2.0)  # raises unless 200
                return
            except OSError:  # not listening yet, or not healthy yet
                time.sleep(1.0)
        raise RuntimeError(f"radixkv serve not healthy after {timeout:.0f} s; see {self.log.name}")

    def stop(self) -> None:
        for sig, wait in ((signal.SIGINT, 30), (signal.SIGTERM, 15), (signal.SIGKILL, 10)):
            if self.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, subprocess.TimeoutExpired):
                    os.killpg(self.proc.pid, sig)  # the group this file started: the server and its children
                    self.proc.wait(wait)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # children that outlived the server's own exit
        self.log.close()


def cpu_seconds(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) of process `pid` and of each of its children, by name."""
    tick, out = os.sysconf("SC_CLK_TCK"), {}
    kids = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout.split()
    for name, p in [("api", pid)] + [(f"child{i}", int(k)) for i, k in enumerate(kids)]:
        with contextlib.suppress(OSError):
            f = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            out[name] = (int(f[11]) + int(f[12])) / tick
    return out


def print_cpu(before: tuple, after_server: dict, after_client, wall: float) -> None:
    """Where the run's CPU went: a process near `wall` seconds is saturated (the profile of the run)."""
    used = {k: v - before[0].get(k, 0.0) for k, v in after_server.items()}
    used["client"] = after_client.ru_utime + after_client.ru_stime - before[1].ru_utime - before[1].ru_stime
    print(f"  cpu over {wall:.2f} s: " + ", ".join(f"{k} {v:.2f} s" for k, v in used.items()), flush=True)


def median_run(runs: list[dict]) -> dict:
    """The run of median output throughput (all of them printed as they ran)."""
    return sorted(runs, key=lambda r: r["output_throughput"])[len(runs) // 2]


def engine_steps(url: str) -> dict[str, float]:
    """The server's radixkv:engine_steps_total by kind (decode, mixed)."""
    out = {}
    for line in http(url + "/metrics", timeout=5.0).decode().splitlines():
        if line.startswith("radixkv:engine_steps_total{"):
            out[line.split('kind="', 1)[1].split('"', 1)[0]] = float(line.rsplit(" ", 1)[1])
    return out


def print_steps(side: str, before: dict, after: dict) -> None:
    """Steps a run took, and how many were mixed (prompt tokens in them: eager, no CUDA graph)."""
    d = {k: after.get(k, 0) - before.get(k, 0) for k in ("decode", "mixed")}
    print(f"  {side} steps: {d['decode'] + d['mixed']:.0f} ({d['mixed']:.0f} mixed)", flush=True)


def running_sampler(url: str, stop: threading.Event, out: list[float]) -> None:
    """Sample /metrics radixkv:num_requests_running every 0.25 s until `stop`."""
    while not stop.wait(0.25):
        try:
            for line in http(url + "/metrics", timeout=5.0).decode().splitlines():
                if line.startswith("radixkv:num_requests_running"):
                    out.append(float(line.rsplit(" ", 1)[1]))
        except OSError:
            pass


def bench_serve(url: str, rows: list[dict], vocab: int, concurrency: int, log_dir: Path, name: str) -> dict:
    """Write `rows` as a radixkv trace and run `radixkv bench-serve` on it; its saved result (every request's times)."""
    trace = log_dir / f"{name}.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cmd = [sys.executable, "-m", "radixkv", "bench-serve", "--base-url", url, "--dataset-name", "trace",
           "--dataset-path", str(trace), "--vocab-size", str(vocab), "--token-id-low", "0", "--ignore-eos",
           "--temperature", "0", "--max-concurrency", str(concurrency), "--metric-percentiles", "50,99",
           "--save-result", "--save-detailed", "--result-dir", str(log_dir), "--result-filename", f"{name}.json"]
    print("$", " ".join(cmd), flush=True)
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    (log_dir / f"{name}.txt").write_text(done.stdout)
    if done.returncode != 0:
        raise RuntimeError(f"bench-serve exited with {done.returncode}:\n{done.stdout[-2000:]}")
    res = json.loads((log_dir / f"{name}.json").read_text())
    want_in, want_out = sum(len(r["tokens"]) for r in rows), sum(r["max_tokens"] for r in rows)
    if (res["total_input_tokens"], res["total_output_tokens"]) != (want_in, want_out):
        print(f"  WARNING {name}: server counted {res['total_input_tokens']} prompt / {res['total_output_tokens']} "
              f"output tokens, the trace holds {want_in} / {want_out}", flush=True)
    print(f"  {name}: {res['completed']}/{res['num_prompts']} ok, {res['total_output_tokens']} out tokens, "
          f"{res['duration']:.2f} s, {res['output_throughput']:.1f} out tok/s, hit rate "
          f"{res['prefix_hit_rate'] or 0:.1%}", flush=True)
    return res


async def _stream_token_ids(url: str, rows: list[dict]) -> dict:
    """The latency run without bench-serve: stream every row at its arrival with return_token_ids;
    per-chunk gaps (ITL), per-request latency and the run's duration."""
    import httpx

    itl: list[float] = []  # seconds between chunks carrying tokens
    lat: list[float] = []  # seconds from send to the end of each request
    out_tokens = 0

    async def one(client: httpx.AsyncClient, row: dict, t0: float) -> None:
        nonlocal out_tokens
        await asyncio.sleep(max(0.0, t0 + row["arrival_s"] - time.perf_counter()))
        body = {"model": "bench", "prompt": row["tokens"], "max_tokens": row["max_tokens"], "temperature": 0,
                "ignore_eos": True, "stream": True, "return_token_ids": True}
        start = last = time.perf_counter()
        seen = 0
        async with client.stream("POST", url + "/v1/completions", json=body) as resp:
            resp.raise_for_status()
            async for line in resp.aiter_lines():
                if not line.startswith("data:") or line.endswith("[DONE]"):
                    continue
                ids = [t for c in json.loads(line[5:]).get("choices") or () for t in c.get("token_ids") or ()]
                if ids:
                    now = time.perf_counter()
                    if seen:
                        itl.append(now - last)
                    seen, last = seen + len(ids), now
        lat.append(time.perf_counter() - start)
        out_tokens += seen

    limits = httpx.Limits(max_connections=len(rows) + 1)
    async with httpx.AsyncClient(limits=limits, timeout=600.0) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(one(client, r, t0) for r in rows))
        duration = time.perf_counter() - t0
    return {"itl_s": itl, "latencies_s": lat, "duration": duration, "output_throughput": out_tokens / duration}


def streams_text(url: str, rows: list[dict]) -> bool:
    """Send the warm-up rows one at a time (streaming); True if any chunk before the last carried text."""
    import httpx

    text = False
    for row in rows:
        body = {"model": "bench", "prompt": row["tokens"], "max_tokens": 8, "temperature": 0,
                "ignore_eos": True, "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=600.0) as resp:
            resp.raise_for_status()
            for line in resp.iter_lines():
                if line.startswith("data:") and not line.endswith("[DONE]"):
                    for c in json.loads(line[5:]).get("choices") or ():
                        text = text or bool(c.get("text") and c.get("finish_reason") is None)
    return text


def run_server(a, model: str, vocab: int, work: dict, todo: list[str], log_dir: Path) -> dict:
    """Every row's server run: {name: {output_throughput, duration, itl_s, latencies_s, running}}."""
    res: dict = {}
    server = Server(model, a, log_dir / "server.log")
    try:
        server.wait_healthy(a.server_timeout)
        has_text = streams_text(server.url, work["warmup"])
        runs: dict[str, list[dict]] = {}
        for name in (n for n in todo for _ in range(1 if n == "latency" else a.repeat)):
            try:  # every run starts with a cold prefix cache
                http(server.url + "/reset_prefix_cache", data=b"")
            except OSError as err:
                print(f"  warning: POST /reset_prefix_cache: {err}", flush=True)
            stop, samples = threading.Event(), []
            sampler = threading.Thread(target=running_sampler, args=(server.url, stop, samples), daemon=True)
            sampler.start()
            try:
                if name == "latency" and not has_text:
                    print("  latency: the model streams no text (no tokenizer), so bench-serve cannot time ITL; "
                          "sending the trace with return_token_ids instead", flush=True)
                    res[name] = asyncio.run(_stream_token_ids(server.url, work[name]))
                else:
                    cpu = cpu_seconds(server.proc.pid), resource.getrusage(resource.RUSAGE_CHILDREN)
                    steps = engine_steps(server.url)
                    conc = len(work[name]) if name == OPEN else a.concurrency
                    r = bench_serve(server.url, work[name], vocab, conc, log_dir, name)
                    print_cpu(cpu, cpu_seconds(server.proc.pid), resource.getrusage(resource.RUSAGE_CHILDREN),
                              r["duration"])
                    print_steps("server", steps, engine_steps(server.url))
                    ok = [q for q in r["requests"] if q["success"]]
                    runs.setdefault(name, []).append({
                        "output_throughput": r["output_throughput"], "duration": r["duration"],
                        "itl_s": [g for q in ok for g in q["itl"]], "latencies_s": [q["latency"] for q in ok]})
                    res[name] = median_run(runs[name])
            finally:
                stop.set()
                sampler.join()
            res[name]["running"] = samples
            if name != "latency":  # the run's shape: requests running, every 0.25 s
                print(f"  {name} running: " + " ".join(f"{x:.0f}" for x in samples), flush=True)
    finally:
        server.stop()
    return res


# ---------------------------------------------------------------- offline side

def run_offline(a, model: str, work: dict, todo: list[str], batch: int | None) -> dict:
    import torch

    from radixkv import LLM, SamplingParams

    llm = LLM(model, usage="serve", **engine_kwargs(a))  # the server's defaults, so the two sides run one engine config
    sync = torch.cuda.synchronize if torch.cuda.is_initialized() else (lambda: None)  # the engine is on CUDA
    params = SamplingParams(max_tokens=a.output_len, ignore_eos=True, temperature=0)
    llm.generate([r["tokens"] for r in work["warmup"]], SamplingParams(max_tokens=8, ignore_eos=True, temperature=0))
    res: dict = {}
    for name in (n for n in todo if n not in ("latency", OPEN) for _ in range(a.repeat)):
        llm.reset_prefix_cache()  # every run starts with a cold prefix cache, as the server's
        sync()
        t, before = time.perf_counter(), llm.core.stats()
        outs = llm.generate([r["tokens"] for r in work[name]], params)
        sync()
        wall, after = time.perf_counter() - t, llm.core.stats()
        print_steps("offline", {"decode": before.num_steps - before.mixed_steps, "mixed": before.mixed_steps},
                    {"decode": after.num_steps - after.mixed_steps, "mixed": after.mixed_steps})
        n_out = sum(len(o.token_ids) for o in outs)
        res.setdefault(name, []).append({"output_throughput": n_out / wall})
        print(f"  offline {name}: {len(outs)} requests, {n_out} out tokens, {wall:.2f} s, {n_out / wall:.1f} out tok/s")
    res = {name: median_run(rs) for name, rs in res.items()}
    if batch:  # decode-only steps at the latency run's batch: workload (a)'s prompts, all decoding
        reqs = llm.add_requests([r["tokens"] for r in work["latency"][:batch]], params)
        while not all(len(r.output) >= 1 for r in reqs):
            llm.step()
        n = max(1, a.output_len - 1 - max(len(r.output) for r in reqs))  # steps before the first finishes
        sync()
        t = time.perf_counter()
        for _ in range(n):
            llm.step()
        sync()
        res["latency"] = {"decode_step_s": (time.perf_counter() - t) / n}
        print(f"  offline decode: batch {batch}, {n} steps, {1e3 * res['latency']['decode_step_s']:.2f} ms/step")
        while llm.has_work():
            llm.step()
    return res


# ---------------------------------------------------------------- main

def main() -> int:
    a = parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the `finally`s that stop the server
    log_dir = Path(a.log_dir or tempfile.mkdtemp(prefix="serve_vs_offline-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    model = a.model or str(log_dir / "config.json")
    if a.model is None:
        Path(model).write_text(json.dumps(TINY if a.tiny_model else LLAMA3_8B, indent=1))
    cfg = Path(model) / "config.json" if Path(model).is_dir() else Path(model)
    vocab = a.vocab_size or (json.loads(cfg.read_text())["vocab_size"] if cfg.suffix == ".json" else None)
    if vocab is None or vocab <= LOW_ID:
        sys.exit(f"error: give --vocab-size (> {LOW_ID}) for {model}")
    todo = [w for w in a.workloads.split(",") if w]
    if set(todo) - {"prefix-repetition", "random", "latency", OPEN}:
        sys.exit(f"error: --workloads: expected some of prefix-repetition,random,latency,{OPEN}, got {a.workloads}")
    work = make_workloads(a, vocab)
    work[OPEN] = work["prefix-repetition"]  # the same prompts, all sent at once (no closed loop)
    print(f"model {model} (vocab {vocab}), engine flags: {' '.join(engine_argv(a)) or '(defaults)'}; logs in {log_dir}")

    server = run_server(a, model, vocab, work, todo, log_dir)
    batch = None
    if "latency" in todo:
        lat = server["latency"]
        samples = [s for s in lat["running"] if s > 0] or [0.0]
        batch = max(1, min(round(statistics.fmean(samples)), len(work["latency"])))
        print(f"  latency run: mean running {statistics.fmean(samples):.2f} while busy (/metrics, {len(samples)} "
              f"samples), {sum(lat['latencies_s']) / lat['duration']:.2f} in flight (latency sum / duration) "
              f"-> decode step timed at batch {batch}")
    offline = run_offline(a, model, work, todo, batch)

    rows = []
    for name in todo:
        s, o = server[name], offline.get("prefix-repetition" if name == OPEN else name, {})
        itl = s["itl_s"] if name == "latency" else []
        rows.append({"workload": f"prefix-repetition@{a.rate:g}rps" if name == "latency" else name,
                     "server_output_tok_s": s["output_throughput"],
                     "offline_output_tok_s": o.get("output_throughput"),
                     "ratio": s["output_throughput"] / o["output_throughput"] if "output_throughput" in o else None,
                     "itl_p50_ms": 1e3 * statistics.median(itl) if itl else None,
                     "decode_step_ms": 1e3 * o["decode_step_s"] if "decode_step_s" in o else None})
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(rows, indent=2) + "\n")
        print(f"wrote {a.json}")

    head = ("workload", "server out tok/s", "offline out tok/s", "ratio", "ITL p50 ms", "decode step ms")
    widths, fmts = (26, 18, 19, 8, 12, 16), ("{}", "{:.1f}", "{:.1f}", "{:.3f}", "{:.2f}", "{:.2f}")

    def line(cells: list[str] | tuple[str, ...]) -> str:
        return cells[0].ljust(widths[0]) + "".join(c.rjust(w) for c, w in zip(cells[1:], widths[1:]))

    print("\n" + line(head) + "\n" + "-" * sum(widths))
    for r in rows:  # the keys in head's order
        print(line(["-" if v is None else f.format(v) for v, f in zip(r.values(), fmts)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
