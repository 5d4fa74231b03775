"""Trace formats: hash-id expansion, readers, writer, detection, malformed input."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from radixkv.workloads.trace_loading import detect_format, load_trace, read_weka
from radixkv.workloads.traces import (
    HashedPrompt, TraceError, TraceFormat, TraceRequest, byte_tokenize, expand_hash_ids, record_requests,
    write_trace,
)

SHARED = Path(__file__).resolve().parents[3].parent / "shared" / "traces"
MOONCAKE = SHARED / "mooncake" / "synthetic_trace.jsonl"
WEKA = SHARED / "weka_claude_code"


def _jsonl(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


# ---------------------------------------------------------------- expand_hash_ids


def test_expand_equal_ids_equal_blocks_different_ids_disjoint():
    a = expand_hash_ids([7, 3, 9], 3 * 512)
    b = expand_hash_ids([7, 3, 4], 2 * 512 + 100)
    assert a.dtype == np.int32 and len(a) == 1536 and len(b) == 1124
    np.testing.assert_array_equal(a[:1024], b[:1024])
    assert not set(a[1024:].tolist()) & set(b[1024:].tolist())
    # the same id gives the same block wherever it sits
    np.testing.assert_array_equal(expand_hash_ids([3], 512), a[512:1024])
    # different ids of one prompt: blocks share no token
    assert len(np.unique(a)) == len(a)


def test_expand_cuts_last_block_and_checks_length():
    t = expand_hash_ids([1, 2], 513, block_tokens=512)
    np.testing.assert_array_equal(t[512:], expand_hash_ids([2], 1, block_tokens=512))
    with pytest.raises(ValueError, match="input_length 512 does not fit 2 blocks"):
        expand_hash_ids([1, 2], 512)
    with pytest.raises(ValueError, match="does not fit"):
        expand_hash_ids([1, 2], 1025)
    with pytest.raises(ValueError, match="hash ids must lie"):
        expand_hash_ids([-1], 10)
    with pytest.raises(ValueError, match="hash ids must lie"):
        expand_hash_ids([2**31 // 64], 10, block_tokens=64)


def test_expand_small_blocks_match_block_size():
    t = expand_hash_ids([5, 5, 6], 150, block_tokens=64)
    np.testing.assert_array_equal(t[:64], t[64:128])
    assert len(t) == 150


# ---------------------------------------------------------------- Mooncake


def test_mooncake_reader(tmp_path):
    p = _jsonl(tmp_path / "m.jsonl", [
        {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]},
        {"timestamp": 1500, "input_length": 512, "output_length": 3, "hash_ids": [0]},
    ])
    assert detect_format(p) is TraceFormat.MOONCAKE
    tr = load_trace(p)
    assert tr.format is TraceFormat.MOONCAKE and tr.block_tokens == 512 and tr.skipped == 0
    r0, r1 = tr.requests
    assert (r0.arrival_s, r0.max_tokens, r0.num_prompt_tokens) == (0.0, 5, 600)
    assert (r1.arrival_s, r1.max_tokens) == (1.5, 3)
    np.testing.assert_array_equal(r0.tokens()[:512], r1.tokens())


def test_mooncake_missing_tail_ids_get_fresh_content(tmp_path):
    p = _jsonl(tmp_path / "m.jsonl", [
        {"timestamp": 0, "input_length": 1000, "output_length": 1, "hash_ids": [4]},
        {"timestamp": 0, "input_length": 1000, "output_length": 1, "hash_ids": [4]},
    ])
    a, b = (r.tokens() for r in load_trace(p).requests)
    np.testing.assert_array_equal(a[:512], b[:512])
    assert not set(a[512:].tolist()) & set(b[512:].tolist())


def test_mooncake_huge_hash_ids_are_renumbered(tmp_path):
    big = 2**62
    p = _jsonl(tmp_path / "m.jsonl", [
        {"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [big, big + 1]},
        {"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [big, 7]},
    ])
    a, b = (r.tokens() for r in load_trace(p).requests)
    np.testing.assert_array_equal(a[:512], b[:512])
    assert not set(a[512:].tolist()) & set(b[512:].tolist())


@pytest.mark.parametrize("record, field", [
    ({"timestamp": 0, "input_length": 10, "output_length": 1}, "hash_ids"),
    ({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [2**63]}, "hash_ids"),
    ({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1, 2]}, "hash_ids"),
    ({"timestamp": -5, "input_length": 10, "output_length": 1, "hash_ids": [1]}, "timestamp"),
    ({"timestamp": 0, "input_length": "10", "output_length": 1, "hash_ids": [1]}, "input_length"),
    ({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1, "x"]}, "hash_ids"),
])
def test_mooncake_malformed_names_file_line_field(tmp_path, record, field):
    good = {"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}
    p = _jsonl(tmp_path / "bad.jsonl", [good, record, good])
    with pytest.raises(TraceError) as e:
        load_trace(p, TraceFormat.MOONCAKE)
    assert (e.value.line, e.value.field) == (2, field)
    assert f"bad.jsonl:2: line 2, field {field!r}" in str(e.value)
    tr = load_trace(p, TraceFormat.MOONCAKE, skip_bad=True)
    assert (len(tr.requests), tr.skipped) == (2, 1)


def test_invalid_json_line_is_named_and_skippable(tmp_path):
    p = _jsonl(tmp_path / "t.jsonl", [{"tokens": [1, 2], "max_tokens": 2}, "{not json", {"tokens": [3]}])
    with pytest.raises(TraceError, match=r"t.jsonl:2: line 2, field '<json>'"):
        load_trace(p)
    tr = load_trace(p, skip_bad=True)
    assert tr.skipped == 1 and [r.tokens().tolist() for r in tr.requests] == [[1, 2], [3]]


# ---------------------------------------------------------------- own format


def test_radixkv_roundtrip_and_text(tmp_path):
    reqs = [TraceRequest(0.25, np.array([5, 6, 7], np.int32), 4, "s1"),
            TraceRequest(1.0, HashedPrompt(np.array([2, 3]), 100, 64), 2, None)]
    p = tmp_path / "out.jsonl"
    assert write_trace(p, reqs) == 2
    assert detect_format(p) is TraceFormat.RADIXKV
    back = load_trace(p).requests
    assert [(r.arrival_s, r.max_tokens, r.session) for r in back] == [(0.25, 4, "s1"), (1.0, 2, None)]
    for a, b in zip(reqs, back):
        np.testing.assert_array_equal(a.tokens(), b.tokens())

    t = _jsonl(tmp_path / "text.jsonl", [{"arrival_s": 0, "text": "héllo", "max_tokens": 3}])
    (r,) = load_trace(t).requests
    np.testing.assert_array_equal(r.tokens(), byte_tokenize("héllo"))
    assert r.num_prompt_tokens == len("héllo".encode())


@pytest.mark.parametrize("record, field", [
    ({"arrival_s": 0, "max_tokens": 3}, "tokens"),
    ({"arrival_s": 0, "tokens": [], "max_tokens": 3}, "tokens"),
    ({"arrival_s": 0, "text": "", "max_tokens": 3}, "text"),
    ({"arrival_s": 0, "tokens": [1], "max_tokens": 0}, "max_tokens"),
    ({"arrival_s": "soon", "tokens": [1], "max_tokens": 1}, "arrival_s"),
    ({"arrival_s": 0, "tokens": [1], "max_tokens": 1, "session": [1]}, "session"),
    ([1, 2, 3], "<record>"),
])
def test_radixkv_malformed(tmp_path, record, field):
    p = _jsonl(tmp_path / "t.jsonl", [{"tokens": [1]}, record])
    with pytest.raises(TraceError) as e:
        load_trace(p, TraceFormat.RADIXKV)
    assert (e.value.line, e.value.field) == (2, field)


def test_record_served_requests(tmp_path):
    from radixkv.request import Request

    served = [Request(0, [4, 5, 6], 3, arrival_s=0.5, namespace="chat-1"),
              Request(1, np.arange(5, dtype=np.int32), 1, arrival_s=2.0)]
    p = tmp_path / "rec.jsonl"
    assert record_requests(p, served) == 2
    back = load_trace(p).requests
    assert [(r.arrival_s, r.session, r.max_tokens, r.tokens().tolist()) for r in back] == \
           [(0.5, "chat-1", 3, [4, 5, 6]), (2.0, None, 1, [0, 1, 2, 3, 4])]


def test_detect_rejects_unknown(tmp_path):
    p = _jsonl(tmp_path / "x.jsonl", [{"foo": 1}])
    with pytest.raises(TraceError, match="cannot detect"):
        detect_format(p)
    with pytest.raises(FileNotFoundError):
        load_trace(tmp_path / "missing.jsonl")


# ---------------------------------------------------------------- WEKA


def _weka(path: Path, conv_id: str, requests: list) -> Path:
    path.write_text(json.dumps({"id": conv_id, "block_size": 64, "hash_id_scope": "local",
                                "requests": requests}, indent=1))
    return path


def test_weka_conversations_kept_apart_nested_and_sorted(tmp_path):
    d = tmp_path / "weka"
    d.mkdir()
    _weka(d / "a.json", "a", [
        {"t": 0.0, "in": 130, "out": 5, "hash_ids": [1, 2], "think_time": 0.0},
        {"t": 9.0, "in": 200, "out": 5, "hash_ids": [1, 2, 3], "think_time": 4.0,
         "subagent_requests": [{"t": 3.0, "in": 64, "out": 2, "hash_ids": [1]}]},
    ])
    _weka(d / "b.json", "b", [{"t": 1.0, "in": 128, "out": 1, "hash_ids": [1, 2]}])
    assert detect_format(d) is TraceFormat.WEKA and detect_format(d / "a.json") is TraceFormat.WEKA
    tr = load_trace(d)
    assert tr.format is TraceFormat.WEKA and tr.block_tokens == 64
    assert [(r.arrival_s, r.session) for r in tr.requests] == [(0.0, "a"), (1.0, "b"), (3.0, "a"), (9.0, "a")]
    a0, b0, sub, a1 = (r.tokens() for r in tr.requests)
    np.testing.assert_array_equal(a0[:128], a1[:128])  # same conversation shares its blocks
    np.testing.assert_array_equal(sub, a0[:64])  # nested sub-agent shares its parent's scope
    assert not set(a0.tolist()) & set(b0.tolist())  # equal local ids, different files: disjoint
    assert not set(a0[128:].tolist()) & set(a1[128:].tolist())  # uncovered tails are private
    assert len(a1) == 200


def test_weka_think_time_when_t_is_missing(tmp_path):
    p = _weka(tmp_path / "k.json", "k", [
        {"t": 2.0, "in": 64, "out": 1, "hash_ids": [1], "api_time": 3.0},
        {"in": 128, "out": 1, "hash_ids": [1, 2], "think_time": 4.0, "api_time": 1.0},
        {"in": 192, "out": 1, "hash_ids": [1, 2, 3], "think_time": 0.5},
    ])
    assert [r.arrival_s for r in read_weka(p).requests] == [2.0, 9.0, 10.5]


def test_weka_bad_header_named_without_line(tmp_path):
    p = tmp_path / "h.json"
    p.write_text(json.dumps({"id": "h", "block_size": "big", "requests": []}))
    with pytest.raises(TraceError, match=r"h.json: field 'block_size': expected an integer") as e:
        read_weka(p)
    assert e.value.line is None


def test_weka_malformed_request_named(tmp_path):
    p = _weka(tmp_path / "c.json", "c", [{"t": 0, "in": 64, "hash_ids": [1]}, {"t": 1, "hash_ids": [1]}])
    with pytest.raises(TraceError, match=r"c.json:2: request 2, field 'in'"):
        read_weka(p)
    assert read_weka(p, skip_bad=True).skipped == 1


# ---------------------------------------------------------------- shared public traces


@pytest.mark.skipif(not MOONCAKE.exists(), reason="shared Mooncake trace not present")
def test_public_mooncake_trace_loads_whole():
    tr = load_trace(MOONCAKE)
    assert len(tr.requests) == 3993
    assert sum(r.num_prompt_tokens for r in tr.requests) == 61_194_628
    assert tr.requests[-1].arrival_s == pytest.approx(1022.025, abs=1.0)


@pytest.mark.skipif(not WEKA.exists(), reason="shared WEKA traces not present")
def test_public_weka_folder_loads():
    tr = load_trace(WEKA)
    assert len(tr.requests) == 572 and len({r.session for r in tr.requests}) == 11
    arrivals = [r.arrival_s for r in tr.requests]
    assert arrivals == sorted(arrivals)
