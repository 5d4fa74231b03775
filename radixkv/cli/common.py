"""What every `radixkv` subcommand shares: the user-facing error, exit statuses, and checks of
the files a command will write (made before anything runs, so a long run is never lost to a
bad output path)."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from radixkv.argtypes import positive_int
from radixkv.config import (
    DTYPE_ALIASES,
    DTYPES,
    KV_DTYPE_ALIASES,
    KV_DTYPES,
    LOAD_FORMATS,
    check_load_format,
)

EXIT_NOTHING_COMPLETED = 1
EXIT_USAGE = 2
EXIT_BROKEN_PIPE = 128 + 13  # what a shell reports for a command killed by SIGPIPE
MAX_PAGES = 2**31 - 1  # page ids are int32 (PagePool)
DTYPE_CHOICES = DTYPES + tuple(DTYPE_ALIASES)
KV_DTYPE_CHOICES = KV_DTYPES + tuple(KV_DTYPE_ALIASES)


class CliError(Exception):
    """A user-facing error: printed as `radixkv: error: ...`, exit status 2."""



def one_line(message: object) -> str:
    """A message on one line: its lines stripped and joined with spaces."""
    return " ".join(part.strip() for part in str(message).splitlines() if part.strip())


def pages_arg(text: str) -> int:
    v = positive_int(text)
    if v > MAX_PAGES:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_PAGES:,} pages (2**31 - 1: page ids are int32), "
                                         f"got {v:,}")
    return v


def load_format_arg(text: str) -> str:
    """--load-format's value: one of LOAD_FORMATS (the engine's own message otherwise)."""
    try:
        return check_load_format(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


LOAD_FORMAT_HELP = (f"how to load the weights: {' or '.join(LOAD_FORMATS)} (dummy: random weights shaped by the "
                    f"folder's config.json, with its tokenizer and chat template; default auto)")


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


def not_utf8(flag: str, path: str | None, e: UnicodeDecodeError) -> str:
    what = "a file in it is" if path and Path(path).is_dir() else "is"
    return f"{flag} {path}: {what} not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start})"


def out_of_memory(e: BaseException) -> bool:
    """A failed allocation: MemoryError, torch's OutOfMemoryError, or the CPU allocator's RuntimeError."""
    return isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError" or (
        isinstance(e, RuntimeError) and "can't allocate memory" in str(e))
