"""The `radixkv` command: replay a trace, generate synthetic traces, run the engine.

    radixkv replay [TRACE] [--simulate] [--sequential | --concurrency N] ...
    radixkv gen multi-turn|few-shot|shared-prefix -o OUT.jsonl
    radixkv generate MODEL PROMPT... / radixkv bench   (run the engine)

Without TRACE, `replay` runs the sample bundled with the package (cut from the Mooncake
synthetic trace, Apache-2.0; see radixkv/workloads/data/README.md).
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from .config import Policy
from radixkv.replay.replay import ReplayConfig, ReplayMode, ReplayResult, run_replay
from .workloads import WorkloadKind
from radixkv.workloads.traces import TraceError, TraceFormat, TraceRequest, load_trace

SAMPLE_TRACE = "mooncake_sample.jsonl"


class CliError(Exception):
    """A user-facing error: printed as `radixkv: error: ...`, exit status 2."""


def bundled_sample() -> Path:
    """Path of the bundled sample trace (radixkv.workloads.data)."""
    return Path(str(resources.files("radixkv.workloads.data").joinpath(SAMPLE_TRACE)))


# ---------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="radixkv", description="Prefix-caching KV runtime for LLM serving.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    r = sub.add_parser("replay", help="replay a trace through scheduler + prefix cache",
                       description="Replay a trace (radixkv JSONL, Mooncake JSONL, or WEKA JSON files/folder) "
                                   "and report prefix hit rate, peak pages and queueing delay.")
    r.add_argument("trace", nargs="?", help="trace file or WEKA folder (default: the bundled Mooncake sample)")
    r.add_argument("--format", choices=["auto"] + [f.value for f in TraceFormat], default="auto")
    r.add_argument("--simulate", action="store_true",
                   help="no model: a cost model stands in for the forward pass (the default without --model)")
    r.add_argument("--model", metavar="PATH", help="run for real on this Hugging Face model folder (engine)")
    mode = r.add_mutually_exclusive_group()
    mode.add_argument("--sequential", action="store_true",
                      help="serve one request at a time in file order (exact, comparable hit rates)")
    mode.add_argument("--concurrency", type=_positive, default=256, metavar="N",
                      help="requests running at once (scheduler max_running; default 256)")
    r.add_argument("--num-pages", type=_positive, metavar="N", help="KV pool size in pages (default: unlimited)")
    r.add_argument("--page-size", type=_positive, default=16, metavar="N", help="tokens per page (default 16)")
    r.add_argument("--burst", action="store_true",
                   help="every request arrives at t=0 (the hardest case for the scheduler)")
    r.add_argument("--policy", choices=[x.value for x in Policy], default=Policy.LPM.value)
    r.add_argument("--limit", type=_positive, metavar="N", help="replay only the first N requests")
    r.add_argument("--skip-bad", action="store_true", help="skip and count malformed records instead of failing")
    r.add_argument("--json", metavar="OUT.json", help="write the summary (DESIGN.md keys) as JSON")
    r.add_argument("--plot", metavar="OUT.png", help="draw hit rate and pool occupancy over time")
    r.add_argument("--record", metavar="OUT.jsonl", help="write the replayed requests as radixkv JSONL")
    r.add_argument("--no-progress", action="store_true", help="never show a progress bar")
    r.set_defaults(run=_cmd_replay)

    g = sub.add_parser("gen", help="generate a synthetic trace (radixkv JSONL)")
    g.add_argument("kind", type=WorkloadKind, choices=list(WorkloadKind),
                   metavar="{" + ",".join(k.value for k in WorkloadKind) + "}")
    g.add_argument("-o", "--output", required=True, metavar="OUT.jsonl")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--source", metavar="PATH",
                   help="real text to draw from (ShareGPT JSONL for multi-turn, GSM8K folder/JSONL for few-shot)")
    g.add_argument("--sessions", type=_positive, default=16, help="multi-turn: chat sessions")
    g.add_argument("--turns", type=_positive, default=4, help="multi-turn: turns per session (at most)")
    g.add_argument("--shots", type=_positive, default=5, help="few-shot: examples per prompt")
    g.add_argument("--templates", type=_positive, default=2, help="few-shot: distinct example sets")
    g.add_argument("--groups", type=_positive, default=8, help="shared-prefix: groups of prompts")
    g.add_argument("--prompts", type=_positive, default=16,
                   help="shared-prefix: prompts per group; few-shot: prompts per template")
    g.add_argument("--system-len", type=_positive, default=1024, help="shared-prefix: system prompt tokens")
    g.add_argument("--question-len", type=_positive, default=128, help="shared-prefix: question tokens")
    g.add_argument("--max-tokens", type=_positive, default=64, help="output tokens per request")
    g.add_argument("--rate", type=float, default=4.0, help="mean arrivals per second (Poisson)")
    g.set_defaults(run=_cmd_gen)

    e = sub.add_parser("generate", help="generate text with a model (the engine)")
    e.add_argument("model", help="Hugging Face model folder, or a config.json (random weights)")
    e.add_argument("prompts", nargs="+", metavar="PROMPT", help="prompt text (token ids if the model has no tokenizer: "
                                                                "comma-separated, e.g. 1,2,3)")
    e.add_argument("--max-tokens", type=_positive, default=32)
    e.add_argument("--temperature", type=float, default=0.0)
    e.add_argument("--dtype", default="auto")
    e.add_argument("--kv-dtype", default="auto")
    e.add_argument("--page-size", type=_positive, default=16)
    e.set_defaults(run=_cmd_generate)

    b = sub.add_parser("bench", help="end-to-end prefix-cache benchmark: k-shot prompts, cache off vs on",
                       description="Serve k-shot prompts with the prefix cache off, on, and batched; "
                                   "print wall time, hit rate and tokens/s (greedy output must agree).")
    b.add_argument("--model", metavar="PATH", help="model folder or config.json (default: a random byte-level Llama)")
    b.add_argument("--gsm8k", metavar="DIR", help="GSM8K folder (train.jsonl, test.jsonl); default: random tokens")
    b.add_argument("--shots", type=_positive, default=3)
    b.add_argument("--prompts", type=_positive, default=4, help="prompts per template (2 templates)")
    b.add_argument("--max-tokens", type=_positive, default=8)
    b.add_argument("--hidden", type=_positive, default=128, help="hidden size of the default random model")
    b.add_argument("--layers", type=_positive, default=2, help="layers of the default random model")
    b.add_argument("--page-size", type=_positive, default=16)
    b.add_argument("--num-pages", type=_positive, default=4096)
    b.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    b.add_argument("--json", metavar="OUT.json", help="write the rows as JSON")
    b.set_defaults(run=_cmd_bench)
    return p


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


# ---------------------------------------------------------------- replay


def _cmd_replay(a: argparse.Namespace) -> int:
    if a.model and a.simulate:
        raise CliError("--simulate and --model exclude each other (simulate needs no model)")
    path = Path(a.trace) if a.trace else bundled_sample()
    fmt = None if a.format == "auto" else TraceFormat(a.format)
    trace = load_trace(path, fmt, skip_bad=a.skip_bad)
    requests = trace.requests[: a.limit] if a.limit else trace.requests
    if not requests:
        raise CliError(f"{path}: no requests to replay")
    cfg = ReplayConfig(page_size=a.page_size, num_pages=a.num_pages, sequential=a.sequential,
                       concurrency=a.concurrency, burst=a.burst, policy=Policy(a.policy))
    mode = ReplayMode.REAL if a.model else ReplayMode.SEQUENTIAL if a.sequential else ReplayMode.SIMULATE
    bar = None
    if not a.no_progress and sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(total=len(requests), unit="req", desc=f"replay {mode.value}", file=sys.stderr)
    try:
        result = run_replay(requests, cfg, model=a.model, progress=bar.update if bar else None)
    finally:
        if bar is not None:
            bar.close()
    print(format_summary(result, path, trace.format, trace.skipped))
    if a.json:
        out = {k: v for k, v in result.to_json().items() if k != "timeline"}
        out.update(trace=str(path), format=trace.format.value, skipped=trace.skipped)
        Path(a.json).write_text(json.dumps(out, indent=2) + "\n")
    if a.plot:
        from radixkv.replay.plot import plot_replay

        pool = "unlimited pool" if result.unlimited else f"{result.num_pages:,} pages"
        plot_replay(result, a.plot, title=f"{path.name}: {mode.value}, {pool} x {result.page_size} tokens, "
                                          f"hit rate {result.hit_rate:.4f}")
    if a.record:
        from radixkv.workloads.traces import write_trace

        write_trace(a.record, requests)
    return 0


def format_summary(r: ReplayResult, path: Path, fmt: TraceFormat, skipped: int) -> str:
    """The human summary table printed by `radixkv replay`."""
    pool = f"{r.num_pages:,} pages x {r.page_size} tokens" + (" (unlimited: never evicts)" if r.unlimited else "")
    clock = "wall" if r.mode is ReplayMode.REAL else "simulated"
    rows = [
        ("trace", f"{path} ({fmt.value})"),
        ("mode", r.mode.value),
        ("requests", f"{r.requests} ({r.completed} completed, {r.rejected} too large for the pool, "
                     f"{skipped} malformed skipped)"),
        ("prompt tokens", f"{r.prompt_tokens:,}"),
        ("cached (hit) tokens", f"{r.hit_tokens:,}"),
        ("prefix hit rate", f"{r.hit_rate:.4f}"),
        ("KV pool", pool),
        ("peak pages in use", f"{r.peak_pages:,} ({r.peak_pages / r.num_pages:.1%} of pool)"),
        ("preemptions", f"{r.preemptions}"),
        ("queueing delay p50/p99/max", f"{r.wait_p50_s:.3f} / {r.wait_p99_s:.3f} / {r.wait_max_s:.3f} s ({clock})"),
        ("throughput", _throughput(r)),
        ("leaked pages", f"{r.leaked_pages}"),
        ("replay wall time", f"{r.wall_s:.2f} s"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _throughput(r: ReplayResult) -> str:
    if r.sim_seconds <= 0:
        return "n/a"
    clock = "wall" if r.mode is ReplayMode.REAL else "simulated"
    return (f"{r.completed / r.sim_seconds:.2f} req/s, {r.prompt_tokens / r.sim_seconds:,.0f} prompt tok/s, "
            f"{r.output_tokens / r.sim_seconds:,.0f} output tok/s ({clock})")


# ---------------------------------------------------------------- gen, engine commands


def _cmd_gen(a: argparse.Namespace) -> int:
    try:
        reqs = _generate(a)
    except ValueError as e:  # a bad generator setting (e.g. --rate 0)
        raise CliError(str(e)) from None
    from radixkv.workloads.traces import write_trace

    n = write_trace(a.output, reqs)
    print(f"wrote {n} requests ({sum(r.num_prompt_tokens for r in reqs):,} prompt tokens) to {a.output}")
    return 0


def _generate(a: argparse.Namespace) -> list[TraceRequest]:
    if a.kind is WorkloadKind.MULTI_TURN:
        from radixkv.workloads.multi_turn import MultiTurnConfig, multi_turn

        reqs = multi_turn(MultiTurnConfig(sessions=a.sessions, max_turns=a.turns, rate=a.rate, seed=a.seed,
                                          max_reply=a.max_tokens), a.source)
    elif a.kind is WorkloadKind.FEW_SHOT:
        from radixkv.workloads.few_shot import FewShotConfig, few_shot

        reqs = few_shot(FewShotConfig(templates=a.templates, shots=a.shots, prompts_per_template=a.prompts,
                                      max_tokens=a.max_tokens, rate=a.rate, seed=a.seed), a.source)
    else:
        from radixkv.workloads.shared_prefix import SharedPrefixConfig, shared_prefix

        reqs = shared_prefix(SharedPrefixConfig(groups=a.groups, prompts_per_group=a.prompts,
                                                system_len=a.system_len, question_len=a.question_len,
                                                max_tokens=a.max_tokens, rate=a.rate, seed=a.seed))
    return reqs


def _cmd_generate(a: argparse.Namespace) -> int:
    from radixkv.engine.llm import LLM
    from radixkv.engine.sampling import SamplingParams

    llm = LLM(a.model, page_size=a.page_size, dtype=a.dtype, kv_dtype=a.kv_dtype)
    prompts: list = []
    for p in a.prompts:
        if llm.tokenizer is None:
            try:
                prompts.append([int(t) for t in p.split(",")])
            except ValueError:
                raise CliError(f"the model has no tokenizer: give prompts as token ids like 1,2,3, got {p!r}") from None
        else:
            prompts.append(p)
    try:
        outs = llm.generate(prompts, SamplingParams(max_tokens=a.max_tokens, temperature=a.temperature))
    except ValueError as e:  # a prompt the engine refuses (empty, out of vocabulary, too long)
        raise CliError(str(e)) from None
    for p, o in zip(a.prompts, outs):
        shown = o.text if o.text is not None else ",".join(map(str, o.token_ids))
        print(f"[{o.request_id}] {p!r} -> {shown!r}  ({len(o.token_ids)} tokens, {o.cached_tokens} prompt tokens cached)")
    return 0


def _cmd_bench(a: argparse.Namespace) -> int:
    from radixkv.engine import bench
    from radixkv.engine.llm import LLM

    if a.model:
        llm = LLM(a.model, page_size=a.page_size, num_pages=a.num_pages, device=a.device)
    else:
        llm = bench.byte_llama(a.hidden, a.layers, a.page_size, a.num_pages, a.device)
    prompts = bench.few_shot_prompts(llm.spec.vocab_size, a.shots, a.prompts, a.max_tokens, a.gsm8k)
    rows = bench.run_bench(llm, prompts, a.max_tokens)
    print(f"{len(prompts)} {a.shots}-shot prompts (2 templates, mean {sum(map(len, prompts)) / len(prompts):.0f} "
          f"tokens), {a.max_tokens} new tokens each, page {a.page_size}, {llm.device}")
    print(bench.format_table(rows))
    print("greedy tokens identical across modes: True")
    if a.json:
        Path(a.json).write_text(json.dumps([r.as_json() for r in rows], indent=1) + "\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    a = parser.parse_args(argv)
    try:
        return a.run(a)
    except (CliError, TraceError, FileNotFoundError) as e:
        print(f"radixkv: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
