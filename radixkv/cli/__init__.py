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
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from radixkv.cli.bench import add_bench_parser
from radixkv.cli.common import EXIT_BROKEN_PIPE, EXIT_USAGE, CliError, one_line
from radixkv.cli.gen import add_gen_parser
from radixkv.cli.generate import add_generate_parser
from radixkv.cli.plan import add_plan_parser
from radixkv.cli.replay import add_replay_parser
from radixkv.workloads.traces import TraceError


def package_version() -> str:
    """The installed distribution's version, else the package's `__version__` (a source tree)."""
    import importlib.metadata  # here, not at the top: ~20 ms of every command's start-up

    try:
        return importlib.metadata.version("radixkv")
    except importlib.metadata.PackageNotFoundError:
        import radixkv

        return str(getattr(radixkv, "__version__", "unknown"))


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

    add_replay_parser(sub)
    add_gen_parser(sub)
    add_generate_parser(sub)
    add_bench_parser(sub)
    add_plan_parser(sub)

    from radixkv.serve.cli_serve import add_serve_parser  # imports no torch or FastAPI

    add_serve_parser(sub)
    from radixkv.serve.cli_bench import add_bench_serve  # imports no torch or httpx

    add_bench_serve(sub)
    return p


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
