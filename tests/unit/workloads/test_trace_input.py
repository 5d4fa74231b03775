"""Trace input that is not a trace, or holds absurd values: refused where it enters, with the
file, line and field named (issue 16, defects 7 and 10)."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from radixkv.workloads.trace_records import MAX_REQUEST_TOKENS, TraceError
from radixkv.workloads.trace_loading import detect_format, load_trace, read_weka
from radixkv.workloads.traces import TraceFormat

GOOD = {"arrival_s": 0, "tokens": [1, 2, 3], "max_tokens": 2}
MOONCAKE = {"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}


def _write(path: Path, lines: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in lines))
    return path


def test_trace_error_without_a_field_names_the_file_alone():
    assert str(TraceError("t.jsonl", None, None, "the file is empty")) == "t.jsonl: the file is empty"
    assert str(TraceError("t.jsonl", 3, None, "bad")) == "t.jsonl:3: line 3: bad"
    assert str(TraceError("t.jsonl", 3, "f", "bad")) == "t.jsonl:3: line 3, field 'f': bad"


@pytest.mark.parametrize("data, message", [
    (b"", "t.jsonl: the file is empty (no records)"),
    (b"\n \n\t\n", "t.jsonl: the file holds only blank lines (no records)"),
    (gzip.compress(b'{"tokens": [1]}\n', mtime=0), "t.jsonl: is gzip-compressed (decompress it first: gunzip -k"),
    (b"\xfd7zXZ\x00\x00rest", "t.jsonl: is xz-compressed"),
    (b"PK\x03\x04rest", "t.jsonl: is a zip archive"),
    (b'{"tokens": [1]}\x00\n', "t.jsonl: is binary (a NUL byte at offset 15)"),
])
@pytest.mark.parametrize("fmt", [None, TraceFormat.RADIXKV, TraceFormat.MOONCAKE, TraceFormat.WEKA])
def test_files_that_hold_no_text_trace_are_refused_even_with_skip_bad(tmp_path, data, message, fmt):
    p = tmp_path / "t.jsonl"
    p.write_bytes(data)
    if message.endswith("(no records)"):
        if fmt in (TraceFormat.RADIXKV, TraceFormat.MOONCAKE):  # an empty JSONL file holds no records: no error
            assert load_trace(p, fmt, skip_bad=True).requests == []
            return
        if fmt is TraceFormat.WEKA:
            message = message.replace("(no records)", "(no JSON document)")
    with pytest.raises(TraceError) as e:
        load_trace(p, fmt, skip_bad=True)
    assert str(e.value).startswith(message.replace("t.jsonl", str(p)))
    assert e.value.line is None and e.value.field is None


def test_a_folder_is_a_jsonl_trace_of_no_format(tmp_path):
    for fmt in (TraceFormat.RADIXKV, TraceFormat.MOONCAKE):
        with pytest.raises(TraceError, match="is a folder, not a JSONL trace file"):
            load_trace(tmp_path, fmt)
    with pytest.raises(TraceError, match="no \\*.json files in this folder"):
        load_trace(tmp_path)


def test_a_line_not_utf8_is_a_record_skip_bad_counts(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_bytes(json.dumps(GOOD).encode() + b'\n{"text": "caf\xe9"}\n' + json.dumps(GOOD).encode() + b"\n")
    with pytest.raises(TraceError) as e:
        load_trace(p)
    assert (e.value.line, e.value.field) == (2, "<text>") and "not UTF-8 text (byte 0xe9 at column 14)" in str(e.value)
    tr = load_trace(p, skip_bad=True)
    assert (len(tr.requests), tr.skipped) == (2, 1) and tr.first_error.startswith(f"{p}:2: line 2, field '<text>'")
    assert load_trace(_write(tmp_path / "ok.jsonl", [GOOD])).first_error is None


@pytest.mark.parametrize("line, field, problem", [
    ("null", "<record>", "the record is null, not a JSON object"),
    ("[1, 2]", "<record>", "the record is an array, not a JSON object"),
    ('"tokens"', "<record>", "the record is a string, not a JSON object"),
    ("7", "<record>", "the record is a number, not a JSON object"),
    ("{oops", "<json>", "not valid JSON (Expecting property name enclosed in double quotes at column 2)"),
    ("1" * 5000, "<json>", "not valid JSON (Exceeds the limit (4300 digits) for integer string conversion"),
    ("[" * 100_000, "<json>", "not valid JSON (nested too deeply)"),
])
def test_undecodable_and_non_object_lines_say_what_they_are(tmp_path, line, field, problem):
    p = _write(tmp_path / "t.jsonl", [GOOD, line])
    with pytest.raises(TraceError) as e:
        load_trace(p)
    assert (e.value.line, e.value.field) == (2, field) and problem in str(e.value)
    assert load_trace(p, skip_bad=True).skipped == 1


def test_detection_looks_past_a_bad_first_record(tmp_path):
    assert detect_format(_write(tmp_path / "a.jsonl", ["{broken", MOONCAKE])) is TraceFormat.MOONCAKE
    assert detect_format(_write(tmp_path / "b.jsonl", ["null", GOOD])) is TraceFormat.RADIXKV
    assert detect_format(_write(tmp_path / "c.jsonl", [{"timestamp": 0, "input_length": 10}])) is TraceFormat.MOONCAKE
    p = tmp_path / "d.jsonl"
    p.write_bytes(b'{"text": "caf\xe9", "max_tokens": 1}\n')
    assert detect_format(p) is TraceFormat.RADIXKV  # the reader then names the line that is not UTF-8
    with pytest.raises(TraceError, match=r"d.jsonl:1: line 1, field '<text>'"):
        load_trace(p)
    with pytest.raises(TraceError, match=r"e.jsonl:1: line 1, field '<record>': the record is null"):
        detect_format(_write(tmp_path / "e.jsonl", ["null"]))
    with pytest.raises(TraceError, match=r"f.jsonl:1: line 1, field '<json>': not valid JSON .*cannot detect"):
        detect_format(_write(tmp_path / "f.jsonl", ["not json at all"]))


@pytest.mark.parametrize("fmt, record, field", [
    (TraceFormat.MOONCAKE, {**MOONCAKE, "input_length": 2**31, "hash_ids": []}, "input_length"),
    (TraceFormat.MOONCAKE, {**MOONCAKE, "input_length": MAX_REQUEST_TOKENS + 1, "hash_ids": []}, "input_length"),
    (TraceFormat.MOONCAKE, {**MOONCAKE, "output_length": 2**63}, "output_length"),
    (TraceFormat.RADIXKV, {**GOOD, "max_tokens": 2**31}, "max_tokens"),
])
def test_absurd_lengths_are_refused_at_the_cap(tmp_path, fmt, record, field):
    p = _write(tmp_path / "t.jsonl", [record])
    with pytest.raises(TraceError) as e:
        load_trace(p, fmt)
    assert (e.value.line, e.value.field) == (1, field) and "tokens is absurd: at most 16,777,216" in str(e.value)
    ok = {**record, field: MAX_REQUEST_TOKENS}
    assert load_trace(_write(tmp_path / "ok.jsonl", [ok]), fmt).requests[0] is not None  # the cap itself is fine


def test_more_distinct_blocks_than_int32_tokens_is_refused(tmp_path):
    recs = [{"timestamp": i, "input_length": MAX_REQUEST_TOKENS, "output_length": 1, "hash_ids": []}
            for i in range(300)]
    with pytest.raises(TraceError, match=r"t.jsonl: 9,830,400 distinct 512-token blocks .* more than int32 tokens"):
        load_trace(_write(tmp_path / "t.jsonl", recs))


def _weka(path: Path, doc, indent=None) -> Path:
    path.write_text(json.dumps(doc, indent=indent))
    return path


@pytest.mark.parametrize("indent", [None, 1])
def test_weka_document_problems_are_named(tmp_path, indent):
    p = _weka(tmp_path / "w.json", {"id": "w", "block_size": 64}, indent)
    assert detect_format(p) is TraceFormat.WEKA
    with pytest.raises(TraceError, match=r"w.json: field 'requests': missing") as e:
        load_trace(p)
    assert (e.value.line, e.value.field) == (None, "requests")
    with pytest.raises(TraceError, match=r"field 'requests': expected a list of requests, got str"):
        read_weka(_weka(p, {"requests": "none"}, indent))
    with pytest.raises(TraceError, match=r"field 'block_size': 1,099,511,627,776 tokens is absurd"):
        read_weka(_weka(p, {"block_size": 2**40, "requests": []}, indent))
    with pytest.raises(TraceError, match=r"w.json:1: request 1, field 'out': 4,294,967,296 tokens is absurd"):
        read_weka(_weka(p, {"requests": [{"t": 0, "in": 64, "out": 2**32, "hash_ids": [1]}]}, indent))
    with pytest.raises(TraceError, match=r"field '<record>': the document is an array, not a JSON object"):
        read_weka(_weka(p, [1, 2], indent))


def test_weka_file_that_is_empty_or_broken_is_named(tmp_path):
    p = tmp_path / "w.json"
    p.write_text("")
    with pytest.raises(TraceError, match=r"w.json: the file is empty \(no JSON document\)"):
        read_weka(p)
    p.write_bytes(b'{\n  "id": "w",\n  "requests": "caf\xe9"\n}\n')
    with pytest.raises(TraceError) as e:
        read_weka(p)
    assert (e.value.line, e.value.field) == (3, "<text>") and "not UTF-8 text (byte 0xe9 at column 19)" in str(e.value)
    p.write_text('{\n  "id": "w",\n  "requests": [\n')
    with pytest.raises(TraceError, match=r"w.json:4: line 4, field '<json>': not valid JSON"):
        load_trace(p)
