"""Reading a trace file of any format: WEKA conversations, format detection, `load_trace`. No torch.

The formats and the in-memory shape are described in traces.py (radixkv and Mooncake JSONL are read
there); this module adds WEKA kv-cache-tester conversations (one JSON document a file, or a folder of
them) and picks the reader a file needs.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from .trace_records import (Place, RecordFields, TraceError, Undecodable, check_text_file, collect_records, decode_json,
                            json_document, no_records)
from .traces import (Trace, TraceFormat, TraceRequest, compact_ids, fill_tails, first_free_id, hashed_prompt,
                     read_mooncake, read_radixkv)


_NESTED_KEYS = ("requests", "subagent_requests", "subagents", "children")


def _weka_records(reqs: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    """Flatten a conversation's requests, depth first; nested sub-agent lists follow their parent."""
    for i, r in enumerate(reqs if isinstance(reqs, list) else []):
        yield f"{prefix}{i}", r
        if isinstance(r, dict):
            for key in _NESTED_KEYS:
                if isinstance(r.get(key), list):
                    yield from _weka_records(r[key], f"{prefix}{i}.{key}.")


def read_weka(paths: str | Path | Sequence[str | Path], skip_bad: bool = False) -> Trace:
    """WEKA kv-cache-tester conversations (files, or a folder of `*.json`), merged by arrival.

    Each file's local hash ids are shifted past all earlier files' ids; the prompt tail after
    the last full block gets fresh ids. Arrival = `t` (seconds from the conversation start;
    upstream `t` already includes `think_time`, so it is not added again); a record without `t`
    arrives `think_time` after the previous one ended (its arrival + `api_time`). Sessions are
    the conversation ids; nested sub-agent requests keep their parent's session.
    """
    staged: list[TraceRequest] = []
    skipped, offset, block_tokens, first = 0, 0, None, None
    for path in _weka_files(paths):
        doc = json_document(path)
        head = RecordFields(path, None, doc)
        if not isinstance(doc.get("requests"), list):
            raise head.fail("requests", "missing (a WEKA conversation lists its requests under 'requests')"
                            if doc.get("requests") is None else
                            f"expected a list of requests, got {type(doc['requests']).__name__}")
        bt = head.length("block_size", minimum=1, default=64)
        if block_tokens is not None and bt != block_tokens:
            raise head.fail("block_size", f"{bt} differs from earlier files' {block_tokens}")
        block_tokens, session = bt, str(doc.get("id", path.stem))
        prev_end = 0.0  # previous request's arrival + api_time, for records without `t`

        def parse(f: RecordFields) -> TraceRequest:
            nonlocal prev_end
            prompt = hashed_prompt(f, "hash_ids", "in", bt)
            arrival = f.number("t") if f.has("t") else prev_end + f.number("think_time", default=0.0)
            prev_end = arrival + f.number("api_time", default=0.0)
            return TraceRequest(arrival, prompt._replace(hash_ids=prompt.hash_ids + offset),
                                max(f.length("out", minimum=0, default=1), 1), session)

        records = ((i + 1, rec) for i, (_, rec) in enumerate(_weka_records(doc.get("requests"), "")))
        reqs, bad, why = collect_records(path, records, parse, skip_bad, Place.REQUEST)
        skipped, first = skipped + bad, first or why
        staged.extend(reqs)
        offset = max(offset, first_free_id(reqs))
    order = sorted(range(len(staged)), key=lambda i: (staged[i].arrival_s, i))  # stable merge
    staged = compact_ids([staged[i] for i in order], block_tokens or 64, paths)
    reqs = fill_tails(staged, first_free_id(staged))
    return Trace(reqs, TraceFormat.WEKA, skipped, block_tokens or 64, first)


def _weka_files(paths: str | Path | Sequence[str | Path]) -> list[Path]:
    items = [paths] if isinstance(paths, (str, Path)) else list(paths)
    files: list[Path] = []
    for p in map(Path, items):
        if p.is_dir():
            found = sorted(f for f in p.glob("*.json") if f.is_file())
            if not found:
                raise TraceError(p, None, None, "no *.json files in this folder (a WEKA trace folder holds "
                                                "one JSON file a conversation)")
            files.extend(found)
        else:
            files.append(p)
    if not files:
        raise FileNotFoundError(f"no WEKA trace files in {paths}")
    return files


# ---------------------------------------------------------------- detection, loading, writing


_DETECT_LINES = 32  # non-blank lines detect_format looks at (a bad first record does not decide)


def _format_of(rec: dict[str, Any]) -> TraceFormat | None:
    """The format one decoded JSON object belongs to, judged by its keys (None: no telling)."""
    if {"requests", "block_size", "hash_id_scope"} & rec.keys():
        return TraceFormat.WEKA
    if {"hash_ids", "input_length"} & rec.keys():
        return TraceFormat.MOONCAKE
    if {"tokens", "text", "arrival_s", "max_tokens"} & rec.keys():
        return TraceFormat.RADIXKV
    return None


def detect_format(path: str | Path) -> TraceFormat:
    """Guess a trace's format from its first records (a folder means WEKA conversation files).

    The first of the first `_DETECT_LINES` non-blank lines that is a JSON object with a telling
    key decides, so a malformed first record is reported by the format's reader with its line,
    not as "cannot detect". A JSON document spread over many lines is a WEKA conversation.
    TraceError for an empty, compressed or binary file, and when no line tells the format."""
    path = Path(path)
    if path.is_dir():
        return TraceFormat.WEKA
    head = check_text_file(path)
    empty = no_records(path)
    if empty:
        raise TraceError(path, None, None, empty)
    first: tuple[int, Any] | None = None  # (line, decoded value or Undecodable) of the first record
    with path.open("rb") as f:
        seen = 0
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            rec = decode_json(raw)
            first = first or (lineno, rec)
            if isinstance(rec, Undecodable) and rec.field == "<text>":  # judge the format anyway
                rec = decode_json(raw.decode("utf-8", errors="replace").encode())
            if isinstance(rec, dict) and (fmt := _format_of(rec)) is not None:
                return fmt
            seen += 1
            if seen >= _DETECT_LINES:
                break
    assert first is not None  # no_records said there is a non-blank line
    lineno, rec = first
    if isinstance(rec, Undecodable) and rec.field == "<json>" and head.lstrip().startswith(b"{"):
        if b'"requests"' in head:
            return TraceFormat.WEKA  # one pretty-printed JSON document
        json_document(path)  # a document? raises naming where it is broken, else it is WEKA's
        return TraceFormat.WEKA
    if isinstance(rec, Undecodable):
        raise TraceError(path, lineno, rec.field, f"{rec.problem}; cannot detect the format")
    if not isinstance(rec, dict):
        RecordFields(path, lineno, rec)  # raises: the record is null (an array, ...), not a JSON object
    raise TraceError(path, lineno, "<record>", "cannot detect the format (expected radixkv 'tokens'/'text', "
                                               "Mooncake 'hash_ids'+'input_length', or a WEKA 'requests' "
                                               "document); give --format")


def load_trace(path: str | Path, fmt: TraceFormat | None = None, skip_bad: bool = False) -> Trace:
    """Read any supported trace; `fmt=None` detects the format. Raises TraceError on bad records
    unless `skip_bad`, which skips them and counts them in `Trace.skipped`."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"trace not found: {path}")
    fmt = fmt or detect_format(path)
    if fmt is TraceFormat.MOONCAKE:
        return read_mooncake(path, skip_bad)
    if fmt is TraceFormat.WEKA:
        return read_weka(path, skip_bad)
    return read_radixkv(path, skip_bad)
