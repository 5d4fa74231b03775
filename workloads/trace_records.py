"""Reading trace records: JSON lines, typed field access, and errors naming file, line and field.

Every reader in traces.py goes through `RecordFields`, so a malformed record always raises a
`TraceError` like `trace.jsonl:7: field 'input_length': expected an integer, got 'abc'`
before anything is replayed; `skip_bad` counts and skips such records instead. No torch.
"""
from __future__ import annotations

import enum
import json
import math
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

TOKEN_SPACE = 1 << 31  # tokens are int32 in [0, 2**31)
Parsed = TypeVar("Parsed")


class Place(enum.Enum):
    """What a TraceError's number counts: a line of a JSONL file, or a request of a WEKA file."""

    LINE = "line"
    REQUEST = "request"


class TraceError(ValueError):
    """A malformed trace record; names the file, line (1-based; with `Place.REQUEST` the
    request's number in a WEKA file; None for a whole-document field) and field, e.g.
    `trace.jsonl:7: line 7, field 'input_length': expected an integer, got 'abc'`."""

    def __init__(self, path: str | Path, line: int | None, field: str, problem: str,
                 place: Place = Place.LINE) -> None:
        where = f"{path}:" if line is None else f"{path}:{line}: {place.value} {line},"
        super().__init__(f"{where} field {field!r}: {problem}")
        self.path, self.line, self.field, self.problem = str(path), line, field, problem


class RecordFields:
    """Typed access to one record's fields; every failure is a TraceError naming path/line/field."""

    def __init__(self, path: Path, line: int | None, record: Any, place: Place = Place.LINE) -> None:
        self.path, self.line, self.place = path, line, place
        if not isinstance(record, dict):
            raise self.fail("<record>", f"expected a JSON object, got {type(record).__name__}")
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
            raise self.fail(field, f"expected an integer, got {v!r}")
        if v < minimum:
            raise self.fail(field, f"must be >= {minimum}, got {v}")
        return v

    def int_list(self, field: str, *, nonempty: bool, upper: int = TOKEN_SPACE) -> np.ndarray:
        v = self.record.get(field)
        if not isinstance(v, list):
            raise self.fail(field, "missing" if v is None else f"expected a list of integers, got {type(v).__name__}")
        if nonempty and not v:
            raise self.fail(field, "empty")
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            raise self.fail(field, "expected a list of integers")
        if v and (min(v) < 0 or max(v) >= upper):
            raise self.fail(field, f"values must lie in [0, {upper}), got {min(v)}..{max(v)}")
        return np.asarray(v, dtype=np.int64)


def json_lines(path: Path, skip_bad: bool) -> Iterator[tuple[int, Any]]:
    """(line number, decoded record) per non-blank line; an undecodable line raises, or with
    `skip_bad` yields None for `collect_records` to count."""
    with path.open("r", encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as e:
                if not skip_bad:
                    raise TraceError(path, lineno, "<json>", f"not valid JSON ({e.msg})") from None
                yield lineno, None


def collect_records(path: Path, records: Iterable[tuple[int, Any]], parse: Callable[[RecordFields], Parsed],
                    skip_bad: bool, place: Place = Place.LINE) -> tuple[list[Parsed], int]:
    """Parse every (number, record); a bad one raises, or with `skip_bad` is counted and skipped."""
    out: list[Parsed] = []
    skipped = 0
    for lineno, rec in records:
        try:
            if rec is None:  # undecodable line, already judged skippable
                raise TraceError(path, lineno, "<json>", "not valid JSON")
            out.append(parse(RecordFields(path, lineno, rec, place)))
        except TraceError:
            if not skip_bad:
                raise
            skipped += 1
    return out, skipped
