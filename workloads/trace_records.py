"""Reading trace records: JSON lines, typed field access, and errors naming file, line and field.

Every reader in traces.py goes through `RecordFields`, so a malformed record always raises a
`TraceError` like `trace.jsonl:7: field 'input_length': expected an integer, got 'abc'`
before anything is replayed; `skip_bad` counts and skips such records instead. A line that is
not UTF-8 or not JSON is a malformed record too; a file that is no text trace at all (empty,
compressed, binary: `check_text_file`) is refused whatever `skip_bad` says; an empty one
holds no records (`no_records` says so). Lengths are capped
at `MAX_REQUEST_TOKENS`, so an absurd `input_length` is refused here, not as an int32 overflow
or a pool of 2**40 pages later. No torch.
"""
from __future__ import annotations

import enum
import json
import math
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import numpy as np

TOKEN_SPACE = 1 << 31  # tokens are int32 in [0, 2**31)
# tokens one request may hold (prompt, or output): 2**24, above any model's context (10M at most
# today); prompt + output stays far inside int32 positions
MAX_REQUEST_TOKENS = 1 << 24
# what a compressed or binary file starts with -> what it is (a trace must be plain JSON text)
_MAGIC = {b"\x1f\x8b": "gzip-compressed (decompress it first: gunzip -k FILE)",
          b"BZh": "bzip2-compressed (decompress it first: bunzip2 -k FILE)",
          b"\xfd7zXZ\x00": "xz-compressed (decompress it first: unxz -k FILE)",
          b"\x28\xb5\x2f\xfd": "zstd-compressed (decompress it first: unzstd FILE)",
          b"PK\x03\x04": "a zip archive (extract the trace first)"}
Parsed = TypeVar("Parsed")


class Place(enum.Enum):
    """What a TraceError's number counts: a line of a JSONL file, or a request of a WEKA file."""

    LINE = "line"
    REQUEST = "request"


class TraceError(ValueError):
    """A malformed trace record; names the file, line (1-based; with `Place.REQUEST` the
    request's number in a WEKA file; None for a whole-document field) and field, e.g.
    `trace.jsonl:7: line 7, field 'input_length': expected an integer, got 'abc'`.
    field None: the whole file is wrong (`trace.jsonl.gz: gzip-compressed ...`)."""

    def __init__(self, path: str | Path, line: int | None, field: str | None, problem: str,
                 place: Place = Place.LINE) -> None:
        where = [] if line is None else [f"{place.value} {line}"]
        if field is not None:
            where.append(f"field {field!r}")
        head = f"{path}:" if line is None else f"{path}:{line}:"
        super().__init__(f"{head} {', '.join(where)}: {problem}" if where else f"{head} {problem}")
        self.path, self.line, self.field, self.problem = str(path), line, field, problem


def json_type(v: Any) -> str:
    """JSON's name for a decoded value's type (null, boolean, number, string, array, object)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    return {str: "string", list: "array", dict: "object"}.get(type(v), type(v).__name__)


class RecordFields:
    """Typed access to one record's fields; every failure is a TraceError naming path/line/field."""

    def __init__(self, path: Path, line: int | None, record: Any, place: Place = Place.LINE) -> None:
        self.path, self.line, self.place = path, line, place
        if not isinstance(record, dict):
            what = "document" if line is None else "record"
            raise self.fail("<record>", f"the {what} is {_a(json_type(record))}, not a JSON object")
        self.record = record

    def fail(self, field: str, problem: str) -> TraceError:
        return TraceError(self.path, self.line, field, problem, self.place)

    def has(self, field: str) -> bool:
        return field in self.record

    def number(self, field: str, *, minimum: float = 0.0, default: float | None = None) -> float:
        v = self.record.get(field, default)
        if v is None:
            raise self.fail(field, "missing")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise self.fail(field, f"expected a finite number, got {v!r}")
        if v < minimum:
            raise self.fail(field, f"must be >= {minimum}, got {v}")
        return float(v)

    def integer(self, field: str, *, minimum: int = 0, default: int | None = None) -> int:
        v = self.record.get(field, default)
        if v is None:
            raise self.fail(field, "missing")
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.fail(field, f"expected an integer, got {_short(v)}")
        if v < minimum:
            raise self.fail(field, f"must be >= {minimum}, got {_short(v)}")
        return v

    def length(self, field: str, *, minimum: int = 1, default: int | None = None) -> int:
        """A token count: an integer in [minimum, MAX_REQUEST_TOKENS]."""
        v = self.integer(field, minimum=minimum, default=default)
        if v > MAX_REQUEST_TOKENS:
            raise self.fail(field, f"{_short(v)} tokens is absurd: at most {MAX_REQUEST_TOKENS:,} (2**24) "
                                   f"a request, more than any model's context")
        return v

    def int_list(self, field: str, *, nonempty: bool, upper: int = TOKEN_SPACE) -> np.ndarray:
        v = self.record.get(field)
        if not isinstance(v, list):
            raise self.fail(field, "missing" if v is None else f"expected a list of integers, got {type(v).__name__}")
        if nonempty and not v:
            raise self.fail(field, "empty")
        if len(v) > MAX_REQUEST_TOKENS:
            raise self.fail(field, f"{len(v):,} values, more than {MAX_REQUEST_TOKENS:,} (2**24 tokens a request)")
        if v and not _INTS_ONLY.issuperset(map(type, v)):  # one C pass; a bool is no integer here
            raise self.fail(field, "expected a list of integers")
        if v and (min(v) < 0 or max(v) >= upper):
            raise self.fail(field, f"values must lie in [0, {upper}), got {min(v)}..{max(v)}")
        return np.asarray(v, dtype=np.int64)


_INTS_ONLY = frozenset([int])  # json.loads makes plain ints (never a subclass but bool)


def _a(noun: str) -> str:
    return ("an " if noun[0] in "aeiou" else "a ") + noun if noun != "null" else "null"


def _short(v: Any) -> str:
    """repr(v), cut to 60 characters (a 5,000-digit integer stays readable)."""
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}" if abs(v) < 10**40 else f"a {len(str(abs(v)))}-digit integer"
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def check_text_file(path: Path) -> bytes:
    """The first 64 KiB of `path` after refusing what cannot be a JSON text trace: a folder, a
    compressed file or a binary one (a NUL byte). TraceError names the file; OSError when it
    cannot be read. An empty file passes (it holds no records; see `no_records`)."""
    if path.is_dir():
        raise TraceError(path, None, None, "is a folder, not a JSONL trace file "
                                           "(only a WEKA trace may be a folder of JSON files)")
    with path.open("rb") as f:
        head = f.read(1 << 16)
    for magic, what in _MAGIC.items():
        if head.startswith(magic):
            raise TraceError(path, None, None, f"is {what.replace('FILE', str(path))}, not a JSON text trace")
    nul = head.find(b"\0")
    if nul >= 0:
        raise TraceError(path, None, None, f"is binary (a NUL byte at offset {nul}), not a JSON text trace")
    return head


def no_records(path: Path) -> str | None:
    """Why the file `path` holds no record at all ("the file is empty", only blank lines), else None."""
    if path.is_dir():
        return None
    with path.open("rb") as f:
        if not f.read(1):
            return "the file is empty (no records)"
        f.seek(0)
        return None if any(line.strip() for line in f) else "the file holds only blank lines (no records)"


class Undecodable(NamedTuple):
    """Bytes `decode_json` could not decode (not UTF-8, not JSON): why, and on which of their lines."""

    field: str  # "<text>" (not UTF-8) or "<json>"
    problem: str
    line: int | None  # 1-based line within the bytes; None when JSON does not say


_SCAN = json.JSONDecoder().scan_once  # json.loads' own scanner, without its per-call wrappers
_NOT_QUICK = object()


def _quick_decode(raw: bytes) -> Any:
    """decode_json's common case, a well-formed line, in one scan (~2x faster than json.loads);
    _NOT_QUICK for anything else, which the full path then names."""
    try:
        text = raw.decode("utf-8")
        value, end = _SCAN(text, 0)
    except (UnicodeDecodeError, StopIteration, ValueError, RecursionError):
        return _NOT_QUICK
    if end == len(text) or not text[end:].strip(" \t\n\r"):
        return value
    return _NOT_QUICK


def decode_json(raw: bytes) -> Any:
    """The JSON value in `raw` (one line of a JSONL file, or a whole document), else an
    Undecodable saying why: not UTF-8, not JSON, a 5,000-digit number, nesting thousands deep."""
    value = _quick_decode(raw)
    if value is not _NOT_QUICK:
        return value
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line_start = raw.rfind(b"\n", 0, e.start) + 1
        return Undecodable("<text>", f"not UTF-8 text (byte 0x{raw[e.start]:02x} at column "
                                     f"{e.start - line_start + 1}); a trace is UTF-8 JSON",
                           raw.count(b"\n", 0, e.start) + 1)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        return Undecodable("<json>", f"not valid JSON ({e.msg} at column {e.colno})", e.lineno)
    except (ValueError, RecursionError) as e:
        reason = "nested too deeply" if isinstance(e, RecursionError) else str(e).split(":")[0]
        return Undecodable("<json>", f"not valid JSON ({reason})", None)


def json_document(path: Path) -> Any:
    """The one JSON document the file `path` holds (a WEKA conversation); TraceError naming the
    file, and the line where it is broken, when it is empty, compressed, binary, not UTF-8 or not JSON."""
    check_text_file(path)
    empty = no_records(path)
    if empty:
        raise TraceError(path, None, None, empty.replace("no records", "no JSON document"))
    doc = decode_json(path.read_bytes())
    if isinstance(doc, Undecodable):
        raise TraceError(path, doc.line, doc.field, doc.problem)
    return doc


def json_lines(path: Path, skip_bad: bool) -> Iterator[tuple[int, Any]]:
    """(line number, decoded record) per non-blank line; a line that is not UTF-8 or not JSON
    raises, or with `skip_bad` yields an Undecodable for `collect_records` to count."""
    check_text_file(path)
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            rec = decode_json(raw)
            if isinstance(rec, Undecodable) and not skip_bad:
                raise TraceError(path, lineno, rec.field, rec.problem)
            yield lineno, rec


def collect_records(path: Path, records: Iterable[tuple[int, Any]], parse: Callable[[RecordFields], Parsed],
                    skip_bad: bool, place: Place = Place.LINE) -> tuple[list[Parsed], int, str | None]:
    """Parse every (number, record); a bad one raises, or with `skip_bad` is counted and skipped.
    Returns (parsed, skipped, the first skipped record's error or None)."""
    out: list[Parsed] = []
    skipped, first = 0, None
    for lineno, rec in records:
        try:
            if isinstance(rec, Undecodable):  # already judged skippable
                raise TraceError(path, lineno, rec.field, rec.problem, place)
            out.append(parse(RecordFields(path, lineno, rec, place)))
        except TraceError as e:
            if not skip_bad:
                raise
            skipped += 1
            first = first or str(e)
    return out, skipped, first
