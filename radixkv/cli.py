"""The `radixkv` command: replay a trace, generate synthetic traces, run the engine.

    radixkv replay [TRACE | BUNDLED-NAME] [--simulate] [--sequential | --concurrency N] ...
    radixkv gen multi-turn|few-shot|shared-prefix -o OUT.jsonl
    radixkv generate MODEL PROMPT... / radixkv bench   (run the engine)
    radixkv --version

Without TRACE, `replay` runs the sample bundled with the package (cut from the Mooncake
synthetic trace, Apache-2.0); `radixkv replay mooncake-synthetic` replays the whole bundled
trace (see radixkv/workloads/data/README.md).

Exit status: 0 done; 1 a replay in which no request completed; 2 a user mistake (bad flag,
missing or malformed file, a model the engine refuses), reported as one line
`radixkv: error: ...` on stderr; 141 (128 + SIGPIPE) when stdout closed early (`| head`).
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from radixkv.config import DTYPE_ALIASES, KV_DTYPE_ALIASES, DTYPES, KV_DTYPES, Policy
from radixkv.replay.replay import ReplayConfig, ReplayMode, run_replay
from radixkv.replay.report import format_summary, nothing_completed
from radixkv.workloads import WorkloadKind
from radixkv.workloads.data import BUNDLED, DEFAULT_TRACE, bundled_trace
from radixkv.workloads.traces import TraceError, TraceFormat, TraceRequest, load_trace

if TYPE_CHECKING:  # the engine loads torch: only the engine commands and a real replay import it
    from radixkv.engine.llm import LLM

EXIT_NOTHING_COMPLETED = 1
EXIT_USAGE = 2
EXIT_BROKEN_PIPE = 128 + 13  # what a shell reports for a command killed by SIGPIPE
DTYPE_CHOICES = DTYPES + tuple(DTYPE_ALIASES)
KV_DTYPE_CHOICES = KV_DTYPES + tuple(KV_DTYPE_ALIASES)


class CliError(Exception):
    """A user-facing error: printed as `radixkv: error: ...`, exit status 2."""


def bundled_sample() -> Path:
    """Path of the bundled default trace (the 300-request Mooncake sample)."""
    return bundled_trace(DEFAULT_TRACE)


def package_version() -> str:
    """The installed distribution's version, else the package's `__version__` (a source tree)."""
    try:
        return importlib.metadata.version("radixkv")
    except importlib.metadata.PackageNotFoundError:
        import radixkv

        return str(getattr(radixkv, "__version__", "unknown"))


def one_line(message: object) -> str:
    """A message on one line: its lines stripped and joined with spaces."""
    return " ".join(part.strip() for part in str(message).splitlines() if part.strip())


# ---------------------------------------------------------------- parser


class _Parser(argparse.ArgumentParser):
    """argparse with usage mistakes reported as one line, `radixkv: error: ...`, exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"radixkv: error: {one_line(message)}\n")


def build_parser() -> argparse.ArgumentParser:
    """The `radixkv` argument parser (each subcommand sets `run`, called with the namespace)."""
    p = _Parser(prog="radixkv", description="Prefix-caching KV runtime for LLM serving.")
    p.add_argument("--version", action="version", version=f"radixkv {package_version()}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    names = ", ".join(f"{k} = {v[1]}" for k, v in BUNDLED.items())
    r = sub.add_parser("replay", help="replay a trace through scheduler + prefix cache",
                       description="Replay a trace (radixkv JSONL, Mooncake JSONL, or WEKA JSON files/folder) "
                                   "and report prefix hit rate, peak pages and queueing delay. "
                                   "Exits 1 when no request completed.")
    r.add_argument("trace", nargs="?", metavar="TRACE",
                   help=f"trace file, WEKA folder, or a bundled trace (Mooncake synthetic trace, Apache-2.0) "
                        f"by name: {names}; a file or folder of that name takes precedence "
                        f"(default: {DEFAULT_TRACE})")
    r.add_argument("--format", choices=["auto"] + [f.value for f in TraceFormat], default="auto")
    r.add_argument("--simulate", action="store_true",
                   help="no model: a cost model stands in for the forward pass (the default without --model)")
    r.add_argument("--model", metavar="PATH",
                   help="run for real on this model (Hugging Face folder, .gguf, cached hub id, "
                        "or config.json with random weights)")
    r.add_argument("--device", help="real mode: cpu or cuda (default: cuda when available)")
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
    e.add_argument("model", help="Hugging Face model folder, a .gguf file, a hub id in the local cache, "
                                  "or a config.json (random weights)")
    e.add_argument("prompts", nargs="+", metavar="PROMPT", help="prompt text (token ids if the model has no tokenizer: "
                                                                "comma-separated, e.g. 1,2,3)")
    e.add_argument("--max-tokens", type=_positive, default=32)
    e.add_argument("--temperature", type=float, default=0.0)
    e.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES, metavar="DTYPE",
                   help=f"compute dtype: {', '.join(DTYPES)} (aliases: {', '.join(DTYPE_ALIASES)})")
    e.add_argument("--kv-dtype", default="auto", choices=KV_DTYPE_CHOICES, metavar="KV_DTYPE",
                   help=f"KV cache dtype: {', '.join(KV_DTYPES)} (aliases: {', '.join(KV_DTYPE_ALIASES)})")
    e.add_argument("--page-size", type=_positive, default=16)
    e.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    e.set_defaults(run=_cmd_generate)

    b = sub.add_parser("bench", help="end-to-end prefix-cache benchmark: k-shot prompts, cache off vs on",
                       description="Serve k-shot prompts with the prefix cache off, on, and batched; "
                                   "print wall time, hit rate and tokens/s (greedy output must agree).")
    b.add_argument("--model", metavar="PATH", help="model folder, .gguf or config.json (default: a random byte-level Llama)")
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


def trace_path(arg: str | None) -> Path:
    """The trace TRACE names: the bundled default when absent, an existing file or folder, else a
    bundled trace's name; CliError when it is neither."""
    if arg is None:
        return bundled_sample()
    path = Path(arg)
    if path.exists():
        return path
    if arg in BUNDLED:
        return bundled_trace(arg)
    raise CliError(f"trace not found: {arg} (bundled traces: {', '.join(BUNDLED)})")


def _cmd_replay(a: argparse.Namespace) -> int:
    if a.model and a.simulate:
        raise CliError("--simulate and --model exclude each other (simulate needs no model)")
    if a.device and not a.model:
        raise CliError("--device needs --model (only a real replay runs on a device)")
    path = trace_path(a.trace)
    fmt = None if a.format == "auto" else TraceFormat(a.format)
    try:
        trace = load_trace(path, fmt, skip_bad=a.skip_bad)
    except (OSError, UnicodeDecodeError) as e:  # a folder given as a file, unreadable, not text
        raise CliError(f"{path}: cannot read the trace: {e}") from None
    requests = trace.requests[: a.limit] if a.limit else trace.requests
    if not requests:
        raise CliError(f"{path}: no requests to replay")
    cfg = ReplayConfig(page_size=a.page_size, num_pages=a.num_pages, sequential=a.sequential,
                       concurrency=a.concurrency, burst=a.burst, policy=Policy(a.policy))
    mode = ReplayMode.REAL if a.model else ReplayMode.SEQUENTIAL if a.sequential else ReplayMode.SIMULATE
    engine = None
    if a.model:
        engine = build_engine(a.model, page_size=cfg.page_size, num_pages=cfg.num_pages,
                              scheduler=cfg.scheduler_config(), device=a.device)
    bar = None
    if not a.no_progress and sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(total=len(requests), unit="req", desc=f"replay {mode.value}", file=sys.stderr)
    try:
        result = run_replay(requests, cfg, engine=engine, progress=bar.update if bar else None)
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
    if result.completed == 0:
        print(f"radixkv: error: {nothing_completed(result, trace.skipped)}", file=sys.stderr)
        return EXIT_NOTHING_COMPLETED
    return 0


# ---------------------------------------------------------------- gen, engine commands


def _cmd_gen(a: argparse.Namespace) -> int:
    try:
        reqs = _generate(a)
    except ValueError as e:  # a bad generator setting (e.g. --rate 0 or nan), named by its config
        raise CliError(one_line(e)) from None
    from radixkv.workloads.traces import write_trace

    try:
        n = write_trace(a.output, reqs)
    except OSError as e:  # -o names a folder, an unwritable or missing place
        raise CliError(f"{a.output}: cannot write the trace: {e.strerror or e}") from None
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


def build_engine(model: str, **config: Any) -> LLM:
    """`LLM(model, **config)`, with what the engine refuses (an unsupported architecture, a
    missing folder or config.json, an unknown dtype, a device this torch lacks) as a CliError."""
    from radixkv.engine.llm import LLM

    try:
        return LLM(model, **config)
    except (ValueError, TypeError, OSError, ImportError) as e:  # ImportError: a .gguf without gguf
        raise CliError(f"cannot load model {model}: {one_line(e)}") from None


def _cmd_generate(a: argparse.Namespace) -> int:
    from radixkv.engine.sampling import SamplingParams

    llm = build_engine(a.model, page_size=a.page_size, dtype=a.dtype, kv_dtype=a.kv_dtype, device=a.device)
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

    if a.model:
        llm = build_engine(a.model, page_size=a.page_size, num_pages=a.num_pages, device=a.device)
    else:
        try:
            llm = bench.byte_llama(a.hidden, a.layers, a.page_size, a.num_pages, a.device)
        except ValueError as e:  # a device this torch build lacks
            raise CliError(one_line(e)) from None
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
    """Run the command `argv` (default: sys.argv[1:]); returns the exit status (see the module doc)."""
    parser = build_parser()
    a = parser.parse_args(argv)
    try:
        code = a.run(a)
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return code
    except BrokenPipeError:
        # the Python docs' recipe (library/signal.html, "Note on SIGPIPE"): point stdout at devnull so
        # the flush at exit cannot fail again, and leave quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except (CliError, TraceError, FileNotFoundError) as e:
        print(f"radixkv: error: {one_line(e)}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
