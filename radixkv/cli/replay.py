"""`radixkv replay [TRACE | BUNDLED-NAME]`: a trace through scheduler + prefix cache, simulated
or on a model. Exits 1 when no request completed."""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from radixkv.argtypes import count, int_at_least, positive_int
from radixkv.cli.common import EXIT_NOTHING_COMPLETED, MAX_PAGES, CliError, check_output, pages_arg, write_output
from radixkv.cli.load_model import build_engine
from radixkv.config import Policy
from radixkv.files import UnreadableFile, check_regular
from radixkv.replay.replay import ReplayConfig, ReplayMode, run_replay
from radixkv.replay.report import format_summary, nothing_completed
from radixkv.replay.router import RouterKind
from radixkv.workloads.data import BUNDLED, DEFAULT_TRACE, bundled_trace
from radixkv.workloads.trace_loading import load_trace
from radixkv.workloads.traces import TraceFormat, TraceRequest


MAX_REPLICAS = 1024  # each its own scheduler, cache and pool


def add_replay_parser(sub: Any) -> None:
    """Add `replay` to the subparsers; sets `run`."""
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
    mode.add_argument("--concurrency", type=count, default=256, metavar="N",
                      help="requests running at once (scheduler max_running; default 256)")
    r.add_argument("--num-pages", type=pages_arg, metavar="N", help="KV pool size in pages (default: unlimited)")
    r.add_argument("--host-pages", type=host_pages_arg, metavar="N",
                   help="simulated host-memory tier of N pages under the KV pool: evicted blocks are written "
                        "back there and loaded again (a PCIe copy) instead of recomputed (default: none)")
    r.add_argument("--page-size", type=positive_int, default=16, metavar="N", help="tokens per page (default 16)")
    r.add_argument("--burst", action="store_true",
                   help="every request arrives at t=0 (the hardest case for the scheduler)")
    r.add_argument("--policy", choices=[x.value for x in Policy], default=Policy.LPM.value)
    r.add_argument("--limit", type=positive_int, metavar="N", help="replay only the first N requests")
    r.add_argument("--skip-bad", action="store_true", help="skip and count malformed records instead of failing")
    r.add_argument("--replicas", type=int_at_least(1, MAX_REPLICAS, "replicas one process simulates"), metavar="N",
                   help="simulate N replicas, each with its own scheduler, cache and --num-pages pool, "
                        "behind --router (default: one)")
    r.add_argument("--router", choices=[k.value for k in RouterKind],
                   help="with --replicas: how requests are placed (default: prefix)")
    r.add_argument("--json", metavar="OUT.json", help="write the summary as JSON (its keys: docs/replay.md)")
    r.add_argument("--plot", metavar="OUT.png", help="draw hit rate and pool occupancy over time")
    r.add_argument("--record", metavar="OUT.jsonl", help="write the replayed requests as radixkv JSONL")
    r.add_argument("--no-progress", action="store_true", help="never show a progress bar")
    r.set_defaults(run=_cmd_replay)


def host_pages_arg(text: str) -> int:
    """--host-pages: a whole number of pages in [0, 2**31) (0: no host tier)."""
    from radixkv.replay.replay import check_host_pages

    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--host-pages must be a whole number of pages, got {text!r}") from None
    try:
        return check_host_pages(n)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"--host-pages {text}: {e}") from None


def bundled_sample() -> Path:
    """Path of the bundled default trace (the 300-request Mooncake sample)."""
    return bundled_trace(DEFAULT_TRACE)


def trace_path(arg: str | None) -> Path:
    """The trace TRACE names: the bundled default when absent, an existing file or folder, else a
    bundled trace's name; CliError when it is neither."""
    if arg is None:
        return bundled_sample()
    path = Path(arg)
    if path.exists():
        try:  # a FIFO or a device would block or never end: refused before the readers open it
            check_regular(path, "trace file", folder_ok=True)
        except UnreadableFile as e:
            raise CliError(str(e)) from None
        except OSError as e:
            raise CliError(f"{path}: cannot read the trace: {e.strerror or e}") from None
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
    if a.host_pages and a.model:
        raise CliError(f"--host-pages {a.host_pages} is simulated only: it excludes --model (the engine has no host tier yet)")
    if a.host_pages and (a.replicas or 1) > 1:
        raise CliError(f"--host-pages {a.host_pages} is not available with --replicas {a.replicas}")
    cfg = ReplayConfig(page_size=a.page_size, num_pages=a.num_pages, sequential=a.sequential,
                       concurrency=a.concurrency, burst=a.burst, policy=Policy(a.policy),
                       host_pages=a.host_pages or None)
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

