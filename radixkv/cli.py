"""The `radixkv` command: replay a trace, generate synthetic traces, run the engine.

    radixkv replay [TRACE | BUNDLED-NAME] [--simulate] [--sequential | --concurrency N] ...
    radixkv gen multi-turn|few-shot|shared-prefix -o OUT.jsonl
    radixkv generate MODEL PROMPT... / radixkv bench   (run the engine)
    radixkv serve MODEL / radixkv bench-serve --base-url URL   (HTTP server, its benchmark client)
    radixkv --version

Without TRACE, `replay` runs the sample bundled with the package (cut from the Mooncake
synthetic trace, Apache-2.0); `radixkv replay mooncake-synthetic` replays the whole bundled
trace (see radixkv/workloads/data/README.md).

Exit status: 0 done; 1 a replay in which no request completed; 2 a user mistake (bad flag,
missing or malformed file, a model the engine refuses, a pool too large for memory), reported
as one line `radixkv: error: ...` on stderr naming the file, line or flag; 141 (128 + SIGPIPE)
when stdout closed early (`| head`). Output files (--json, --plot, --record) are checked before
anything runs, so a long replay is never lost to a bad output path.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from radixkv.argtypes import positive_int
from radixkv.config import DTYPE_ALIASES, KV_DTYPE_ALIASES, DTYPES, KV_DTYPES, Policy
from radixkv.replay.replay import ReplayConfig, ReplayMode, run_replay
from radixkv.replay.router import RouterKind
from radixkv.replay.report import format_summary, nothing_completed
from radixkv.workloads import WorkloadKind
from radixkv.workloads.data import BUNDLED, DEFAULT_TRACE, bundled_trace
from radixkv.workloads.traces import TraceError, TraceFormat, TraceRequest, load_trace

if TYPE_CHECKING:  # the engine loads torch: only the engine commands and a real replay import it
    from radixkv.engine.llm import LLM

EXIT_NOTHING_COMPLETED = 1
EXIT_USAGE = 2
EXIT_BROKEN_PIPE = 128 + 13  # what a shell reports for a command killed by SIGPIPE
MAX_PAGES = 2**31 - 1  # page ids are int32 (PagePool)
DTYPE_CHOICES = DTYPES + tuple(DTYPE_ALIASES)
KV_DTYPE_CHOICES = KV_DTYPES + tuple(KV_DTYPE_ALIASES)


class CliError(Exception):
    """A user-facing error: printed as `radixkv: error: ...`, exit status 2."""


def bundled_sample() -> Path:
    """Path of the bundled default trace (the 300-request Mooncake sample)."""
    return bundled_trace(DEFAULT_TRACE)


def package_version() -> str:
    """The installed distribution's version, else the package's `__version__` (a source tree)."""
    import importlib.metadata  # here, not at the top: ~20 ms of every command's start-up

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


class _VersionAction(argparse.Action):
    """--version, reading the installed version only when asked (importlib.metadata and the
    distribution's files cost every other command ~20-30 ms of start-up)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 default: Any = argparse.SUPPRESS, help: str = "show the version and exit") -> None:
        super().__init__(option_strings, dest, nargs=0, default=default, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(f"radixkv {package_version()}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    """The `radixkv` argument parser (each subcommand sets `run`, called with the namespace)."""
    p = _Parser(prog="radixkv", description="Prefix-caching KV runtime for LLM serving.")
    p.add_argument("--version", action=_VersionAction)
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
    mode.add_argument("--concurrency", type=positive_int, default=256, metavar="N",
                      help="requests running at once (scheduler max_running; default 256)")
    r.add_argument("--num-pages", type=_pages, metavar="N", help="KV pool size in pages (default: unlimited)")
    r.add_argument("--page-size", type=positive_int, default=16, metavar="N", help="tokens per page (default 16)")
    r.add_argument("--burst", action="store_true",
                   help="every request arrives at t=0 (the hardest case for the scheduler)")
    r.add_argument("--policy", choices=[x.value for x in Policy], default=Policy.LPM.value)
    r.add_argument("--limit", type=positive_int, metavar="N", help="replay only the first N requests")
    r.add_argument("--skip-bad", action="store_true", help="skip and count malformed records instead of failing")
    r.add_argument("--replicas", type=positive_int, metavar="N",
                   help="simulate N replicas, each with its own scheduler, cache and --num-pages pool, "
                        "behind --router (default: one)")
    r.add_argument("--router", choices=[k.value for k in RouterKind],
                   help="with --replicas: how requests are placed (default: prefix)")
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
    g.add_argument("--sessions", type=positive_int, default=16, help="multi-turn: chat sessions")
    g.add_argument("--turns", type=positive_int, default=4, help="multi-turn: turns per session (at most)")
    g.add_argument("--shots", type=positive_int, default=5, help="few-shot: examples per prompt")
    g.add_argument("--templates", type=positive_int, default=2, help="few-shot: distinct example sets")
    g.add_argument("--groups", type=positive_int, default=8, help="shared-prefix: groups of prompts")
    g.add_argument("--prompts", type=positive_int, default=16,
                   help="shared-prefix: prompts per group; few-shot: prompts per template")
    g.add_argument("--system-len", type=positive_int, default=1024, help="shared-prefix: system prompt tokens")
    g.add_argument("--question-len", type=positive_int, default=128, help="shared-prefix: question tokens")
    g.add_argument("--max-tokens", type=positive_int, default=64, help="output tokens per request")
    g.add_argument("--rate", type=float, default=4.0, help="mean arrivals per second (Poisson)")
    g.set_defaults(run=_cmd_gen)

    e = sub.add_parser("generate", help="generate text with a model (the engine)")
    e.add_argument("model", help="Hugging Face model folder, a .gguf file, a hub id in the local cache, "
                                  "or a config.json (random weights)")
    e.add_argument("prompts", nargs="+", metavar="PROMPT", help="prompt text (token ids if the model has no tokenizer: "
                                                                "comma-separated, e.g. 1,2,3)")
    e.add_argument("--max-tokens", type=positive_int, default=32)
    e.add_argument("--temperature", type=float, default=0.0)
    e.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES, metavar="DTYPE",
                   help=f"compute dtype: {', '.join(DTYPES)} (aliases: {', '.join(DTYPE_ALIASES)})")
    e.add_argument("--kv-dtype", default="auto", choices=KV_DTYPE_CHOICES, metavar="KV_DTYPE",
                   help=f"KV cache dtype: {', '.join(KV_DTYPES)} (aliases: {', '.join(KV_DTYPE_ALIASES)})")
    e.add_argument("--page-size", type=positive_int, default=16)
    e.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    e.set_defaults(run=_cmd_generate)

    b = sub.add_parser("bench", help="end-to-end prefix-cache benchmark: k-shot prompts, cache off vs on",
                       description="Serve k-shot prompts with the prefix cache off, on, and batched; "
                                   "print wall time, hit rate and tokens/s (greedy output must agree).")
    b.add_argument("--model", metavar="PATH", help="model folder, .gguf or config.json (default: a random byte-level Llama)")
    b.add_argument("--gsm8k", metavar="DIR", help="GSM8K folder (train.jsonl, test.jsonl); default: random tokens")
    b.add_argument("--shots", type=positive_int, default=3)
    b.add_argument("--prompts", type=positive_int, default=4, help="prompts per template (2 templates)")
    b.add_argument("--max-tokens", type=positive_int, default=8)
    b.add_argument("--hidden", type=positive_int, default=128, help="hidden size of the default random model")
    b.add_argument("--layers", type=positive_int, default=2, help="layers of the default random model")
    b.add_argument("--page-size", type=positive_int, default=16)
    b.add_argument("--num-pages", type=_pages, default=4096)
    b.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    b.add_argument("--json", metavar="OUT.json", help="write the rows as JSON")
    b.set_defaults(run=_cmd_bench)

    m = sub.add_parser("plan", help="KV memory plan: bytes per token, pages and requests that fit a GPU",
                       description="KV bytes per token and page for each KV dtype (scales included), weight bytes, "
                                   "and for a GPU's memory: pages and tokens that fit, peak concurrent requests "
                                   "at --context tokens each, and whether --batch x --context fits. No torch "
                                   "is needed unless --gpu-memory is left to the visible GPU.")
    m.add_argument("model", metavar="MODEL", help="model folder, config.json, .gguf, or a hub id in the local cache")
    m.add_argument("--gpu-memory", metavar="SIZE", help="e.g. 80GiB, 141GB (default: the visible GPU's total)")
    m.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    m.add_argument("--kv-dtype", action="append", choices=[k for k in KV_DTYPE_CHOICES if k != "auto"],
                   help="a KV dtype to plan (repeatable; default: all)")
    m.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="weight dtype (default: the config's)")
    m.add_argument("--page-size", "--block-size", dest="page_size", type=positive_int, default=16)
    m.add_argument("--context", type=positive_int, default=4096, help="tokens per request at its peak")
    m.add_argument("--batch", type=positive_int, default=16, help="concurrent requests of the load to check")
    m.add_argument("--json", metavar="OUT.json", help="also write the plan as JSON ('-' for stdout only)")
    m.set_defaults(run=_cmd_plan)

    from radixkv.serve.cli_serve import add_serve_parser  # imports no torch or FastAPI

    add_serve_parser(sub)
    from radixkv.serve.cli_bench import add_bench_serve  # imports no torch or httpx

    add_bench_serve(sub)
    return p


def _pages(text: str) -> int:
    v = positive_int(text)
    if v > MAX_PAGES:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_PAGES:,} pages (2**31 - 1: page ids are int32), "
                                         f"got {v:,}")
    return v


def check_output(flag: str, path: str | None, plot: bool = False) -> None:
    """Refuse, before anything runs, an output path that cannot be written: a folder, a file in
    a folder that does not exist, (--plot) an image format matplotlib cannot write."""
    if path is None:
        return
    p = Path(path)
    if p.is_dir():
        raise CliError(f"{flag} {path}: is a folder; give a file name")
    if not p.parent.is_dir():
        raise CliError(f"{flag} {path}: folder {str(p.parent)!r} does not exist")
    if p.exists() and not os.access(p, os.W_OK):
        raise CliError(f"{flag} {path}: not writable")
    if plot and p.suffix:
        from matplotlib.backend_bases import FigureCanvasBase

        formats = FigureCanvasBase.get_supported_filetypes()
        if p.suffix[1:].lower() not in formats:
            raise CliError(f"{flag} {path}: cannot draw {p.suffix!r} images; use one of {', '.join(sorted(formats))}")


def write_output(flag: str, path: str, text: str) -> None:
    try:
        Path(path).write_text(text)
    except OSError as e:  # gone or read-only since check_output looked
        raise CliError(f"{flag} {path}: cannot write: {e.strerror or e}") from None


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
    _check_replicas(a)
    check_output("--json", a.json)
    check_output("--plot", a.plot, plot=True)
    check_output("--record", a.record)
    path = trace_path(a.trace)
    fmt = None if a.format == "auto" else TraceFormat(a.format)
    try:
        trace = load_trace(path, fmt, skip_bad=a.skip_bad)
    except OSError as e:  # unreadable (permissions, a device)
        raise CliError(f"{path}: cannot read the trace: {e.strerror or e}") from None
    requests = trace.requests[: a.limit] if a.limit else trace.requests
    if not requests:
        raise CliError(_no_requests(path, trace))
    cfg = ReplayConfig(page_size=a.page_size, num_pages=a.num_pages, sequential=a.sequential,
                       concurrency=a.concurrency, burst=a.burst, policy=Policy(a.policy))
    mode = ReplayMode.REAL if a.model else ReplayMode.SEQUENTIAL if a.sequential else ReplayMode.SIMULATE
    if mode is not ReplayMode.REAL and cfg.num_pages is None:
        _check_unlimited_pool(path, requests, cfg.page_size, with_outputs=mode is ReplayMode.SIMULATE)
    engine = None
    if a.model:
        engine = build_engine(a.model, page_size=cfg.page_size, num_pages=cfg.num_pages,
                              scheduler=cfg.scheduler_config(), device=a.device)
    bar = None
    if not a.no_progress and sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(total=len(requests), unit="req", desc=f"replay {mode.value}", file=sys.stderr)
    fleet = None
    try:
        if (a.replicas or 1) > 1:
            from radixkv.replay.fleet import replay_fleet

            result, fleet = replay_fleet(requests, cfg, a.replicas, RouterKind(a.router or RouterKind.PREFIX.value),
                                         progress=bar.update if bar else None)
        else:
            result = run_replay(requests, cfg, engine=engine, progress=bar.update if bar else None)
    finally:
        if bar is not None:
            bar.close()
    print(format_summary(result, path, trace.format, trace.skipped))
    if fleet is not None:
        from radixkv.replay.report import format_fleet

        print(format_fleet(fleet))
    if a.json:
        out = {k: v for k, v in result.to_json().items() if k != "timeline"}
        out.update(trace=str(path), format=trace.format.value, skipped=trace.skipped)
        if fleet is not None:
            out.update(fleet.json_keys())
        write_output("--json", a.json, json.dumps(out, indent=2) + "\n")
    if a.plot:
        from radixkv.replay.plot import plot_replay

        pool = "unlimited pool" if result.unlimited else f"{result.num_pages:,} pages"
        try:
            plot_replay(result, a.plot, title=f"{path.name}: {mode.value}, {pool} x {result.page_size} tokens, "
                                              f"hit rate {result.hit_rate:.4f}")
        except OSError as e:
            raise CliError(f"--plot {a.plot}: cannot write: {e.strerror or e}") from None
    if a.record:
        from radixkv.workloads.traces import write_trace

        try:
            write_trace(a.record, requests)
        except OSError as e:
            raise CliError(f"--record {a.record}: cannot write: {e.strerror or e}") from None
    if result.completed == 0:
        print(f"radixkv: error: {nothing_completed(result, trace.skipped)}", file=sys.stderr)
        return EXIT_NOTHING_COMPLETED
    return 0


def _check_replicas(a: argparse.Namespace) -> None:
    """Refuse flag combinations a multi-replica replay cannot honour, before anything runs."""
    if a.router is not None and a.replicas is None:
        raise CliError(f"--router {a.router} needs --replicas N (the replicas it places requests on)")
    if (a.replicas or 1) == 1:
        return
    if a.model:
        raise CliError(f"--replicas {a.replicas} runs simulated replicas; it excludes --model (give --simulate)")
    if a.sequential:
        raise CliError(f"--replicas {a.replicas} needs the simulator's concurrent replicas; it excludes --sequential "
                       f"(one request at a time on one cache)")
    if a.plot:
        raise CliError(f"--plot draws one cache's timeline; it is not available with --replicas {a.replicas}")


def _no_requests(path: Path, trace: Any) -> str:
    """Why a loaded trace has nothing to replay, in the user's terms."""
    if trace.skipped:
        which = "its only record was" if trace.skipped == 1 else f"all {trace.skipped:,} records were"
        first = "the error" if trace.skipped == 1 else "the first"
        return f"{path}: no valid records remain: {which} malformed and skipped (--skip-bad); {first}: " \
               f"{trace.first_error}"
    from radixkv.workloads.trace_records import no_records

    return f"{path}: {no_records(path) or 'no requests to replay'}"


def _check_unlimited_pool(path: Path, requests: Sequence[TraceRequest], page_size: int, with_outputs: bool) -> None:
    """An unlimited pool holds every page of every request at once (outputs too when simulated, as
    replay sizes it): refuse one beyond int32 page ids."""
    from radixkv.replay.replay import unlimited_pages

    need = unlimited_pages(requests, page_size, with_outputs)
    if need > MAX_PAGES:
        raise CliError(f"{path}: an unlimited pool for these {len(requests):,} requests needs {need:,} pages of "
                       f"{page_size} tokens, more than a pool holds ({MAX_PAGES:,}); give --num-pages "
                       f"(LRU eviction), a larger --page-size or --limit")


# ---------------------------------------------------------------- gen, engine commands


def _cmd_gen(a: argparse.Namespace) -> int:
    try:
        reqs = _generate(a)
    except UnicodeDecodeError as e:  # --source: the readers open it as UTF-8 text
        raise CliError(not_utf8("--source", a.source, e)) from None
    except OSError as e:  # missing, a folder where a file belongs
        raise CliError(f"--source {a.source}: {e.strerror or e}: {e.filename}") from None
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


def not_utf8(flag: str, path: str | None, e: UnicodeDecodeError) -> str:
    what = "a file in it is" if path and Path(path).is_dir() else "is"
    return f"{flag} {path}: {what} not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start})"


def out_of_memory(e: BaseException) -> bool:
    """A failed allocation: MemoryError, torch's OutOfMemoryError, or the CPU allocator's RuntimeError."""
    return isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError" or (
        isinstance(e, RuntimeError) and "can't allocate memory" in str(e))


def build_engine(model: str, **config: Any) -> LLM:
    """`LLM(model, **config)`, with what the engine refuses (an unsupported architecture, a
    missing, corrupt or truncated model file, an unknown dtype, a device this torch lacks, a KV
    pool larger than memory) as a CliError."""
    from radixkv.engine.llm import LLM

    try:
        return LLM(model, **config)
    except (ValueError, TypeError, OSError, ImportError) as e:  # ImportError: a .gguf without gguf
        raise CliError(f"cannot load model {model}: {one_line(e)}") from None
    except (RuntimeError, MemoryError) as e:
        if not out_of_memory(e):
            raise
        raise CliError(f"cannot load model {model}: out of memory for its weights and a KV pool of "
                       f"{_pool_words(config)} ({one_line(e)[:200]})") from None


def _pool_words(config: dict[str, Any]) -> str:
    pages = config.get("num_pages")
    return (f"{pages:,} pages x {config.get('page_size', 16)} tokens; give a smaller --num-pages or --page-size"
            if pages else f"the default size at --page-size {config.get('page_size', 16)}")


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
    from radixkv.engine.llm import pick_device
    from radixkv.engine.weights import config_errors, error_detail

    check_output("--json", a.json)
    try:
        pick_device(a.device)
    except ValueError as e:  # a device this torch build lacks
        raise CliError(one_line(e)) from None
    if a.model:
        llm = build_engine(a.model, page_size=a.page_size, num_pages=a.num_pages, device=a.device)
    else:
        try:
            llm = bench.byte_llama(a.hidden, a.layers, a.page_size, a.num_pages, a.device)
        except config_errors() as e:  # a --hidden no Llama has (odd head_dim)
            raise CliError(f"cannot build the default random model (--hidden {a.hidden}, --layers {a.layers}): "
                           f"{error_detail(e)}") from None
        except (RuntimeError, MemoryError) as e:
            if not out_of_memory(e):
                raise
            raise CliError(f"out of memory for the default random model (--hidden {a.hidden}, --layers "
                           f"{a.layers}) and a KV pool of {_pool_words(vars(a))}") from None
    try:
        prompts = bench.few_shot_prompts(llm.spec.vocab_size, a.shots, a.prompts, a.max_tokens, a.gsm8k)
    except UnicodeDecodeError as e:
        raise CliError(not_utf8("--gsm8k", a.gsm8k, e)) from None
    except OSError as e:  # missing, a folder where a file belongs
        raise CliError(f"--gsm8k {a.gsm8k}: {e.strerror or e}: {e.filename}") from None
    longest = max(map(len, prompts)) + a.max_tokens
    if longest > llm.max_model_len:
        raise CliError(f"the longest prompt ({longest - a.max_tokens:,} tokens: --shots {a.shots}) plus --max-tokens "
                       f"{a.max_tokens} exceeds the model's context of {llm.max_model_len:,} tokens; "
                       f"use fewer --shots or --max-tokens")
    need = -(-longest // a.page_size)
    if need > llm.num_pages:
        raise CliError(f"--num-pages {llm.num_pages:,} is too small: the longest prompt ({longest - a.max_tokens:,} "
                       f"tokens) plus --max-tokens {a.max_tokens} needs {need:,} pages of {a.page_size} tokens")
    try:
        rows = bench.run_bench(llm, prompts, a.max_tokens)
    except ValueError as e:  # a prompt the engine refuses
        raise CliError(one_line(e)) from None
    print(f"{len(prompts)} {a.shots}-shot prompts (2 templates, mean {sum(map(len, prompts)) / len(prompts):.0f} "
          f"tokens), {a.max_tokens} new tokens each, page {a.page_size}, {llm.device}")
    print(bench.format_table(rows))
    print("greedy tokens identical across modes: True")
    if a.json:
        write_output("--json", a.json, json.dumps([r.as_json() for r in rows], indent=1) + "\n")
    return 0


def _cmd_plan(a: argparse.Namespace) -> int:
    from radixkv import plan

    check_output("--json", None if a.json in (None, "-") else a.json)
    try:
        shape = plan.read_model_shape(a.model)
        gpu = plan.parse_bytes(a.gpu_memory) if a.gpu_memory else _visible_gpu_memory()
        p = plan.plan_memory(shape, gpu, a.gpu_memory_utilization, a.page_size, a.context, a.batch, a.dtype,
                             a.kv_dtype)
    except ValueError as e:
        raise CliError(str(e)) from None
    if a.json == "-":
        print(json.dumps(p.to_json(), indent=1))
        return 0
    print(plan.format_plan(p))
    if a.json:
        Path(a.json).write_text(json.dumps(p.to_json(), indent=1) + "\n")
    return 0


def _visible_gpu_memory() -> int:
    import torch

    if not torch.cuda.is_available():
        raise CliError("no GPU visible: give --gpu-memory (e.g. --gpu-memory 80GiB)")
    return torch.cuda.get_device_properties(0).total_memory


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
    except MemoryError as e:  # e.g. a --num-pages pool of 2**31 - 1 pages on a small machine
        print(f"radixkv: error: out of memory ({one_line(e) or 'MemoryError'}); give a smaller --num-pages "
              f"or --limit", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
