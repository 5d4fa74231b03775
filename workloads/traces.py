"""Trace formats: expand and save recorded or generated traffic; reading a file: trace_loading.py. No torch.

Three formats, one in-memory shape (`TraceRequest`):

* radixkv JSONL (ours), one request a line:
  `{"arrival_s": 0.5, "session": "chat-3", "tokens": [1, 2, ...], "max_tokens": 64}`;
  `"text"` may replace `"tokens"`: it is tokenised byte-level (UTF-8 bytes -> ids 0..255),
  deterministic and tokenizer-free, so two texts share a cached prefix exactly when their
  UTF-8 encodings share it. `session` is optional.
* Mooncake JSONL: `timestamp` (ms), `input_length`, `output_length`, `hash_ids`
  (one id per 512-token block; equal ids mean equal content).
* WEKA kv-cache-tester JSON, one conversation a file (or a folder of them): `block_size`
  (64) local `hash_ids` per request, `t` (s), `in`, `out`, nested sub-agent requests.
  Ids are comparable only inside one file, so each file's ids are shifted past the
  previous files' (conversations never share blocks).

Hash ids expand in closed form (block h = h * block_tokens + 0..block_tokens-1), so equal ids
give equal blocks and different ids give blocks with no token in common; ids too large for
int32 tokens (any in [0, 2**63) are accepted) are first renumbered densely. Blocks a trace does
not cover (WEKA's tail after the last full block) get fresh ids: content nobody else has.
Field checks and the errors naming file, line and field live in trace_records.py.
"""
from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from .trace_records import (MAX_REQUEST_TOKENS, TOKEN_SPACE, RecordFields, TraceError, collect_records, json_lines)

MOONCAKE_BLOCK_TOKENS = 512


class TraceFormat(enum.Enum):
    RADIXKV = "radixkv"
    MOONCAKE = "mooncake"
    WEKA = "weka"


# ---------------------------------------------------------------- hash ids -> tokens


def expand_hash_ids(hash_ids: Sequence[int] | np.ndarray, input_length: int,
                    block_tokens: int = MOONCAKE_BLOCK_TOKENS, out: np.ndarray | None = None) -> np.ndarray:
    """Deterministic int32 tokens [input_length] for a list of block hash ids.

    Block id h holds tokens h * block_tokens + i for i < block_tokens: equal ids give equal
    blocks, different ids give blocks sharing no token, and the whole expansion is one
    vectorised multiply-add (closed form, so no per-block cache is needed: all 61M tokens of
    the Mooncake synthetic trace expand in ~0.03 s). The last block is cut so the result has
    exactly `input_length` tokens, which must lie in ((n - 1) * block_tokens, n * block_tokens]
    for n = len(hash_ids). Ids must be < 2**31 // block_tokens (tokens stay int32).

    out: an int32 scratch array of at least n * block_tokens elements to expand into (a
    sequential replay reuses one, so no fresh pages are faulted in per request); the result is
    then a view of it, valid until the next expansion into the same array.
    """
    if block_tokens < 1:
        raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
    ids = np.asarray(hash_ids, dtype=np.int64)  # [num_blocks]
    if ids.ndim != 1:
        raise ValueError(f"hash_ids must be one-dimensional, got shape {ids.shape}")
    lo, hi = (len(ids) - 1) * block_tokens, len(ids) * block_tokens
    if not lo < input_length <= hi:
        raise ValueError(f"input_length {input_length} does not fit {len(ids)} blocks of "
                         f"{block_tokens} tokens (needs {lo} < input_length <= {hi})")
    if len(ids) == 0:
        return np.empty(0, dtype=np.int32)
    if int(ids.view(np.uint64).max()) >= TOKEN_SPACE // block_tokens:  # one pass: a negative id reads huge
        raise ValueError(f"hash ids must lie in [0, {TOKEN_SPACE // block_tokens}) for "
                         f"{block_tokens}-token blocks, got {int(ids.min())}..{int(ids.max())}")
    base = np.multiply(ids, block_tokens, dtype=np.int32, casting="unsafe")  # [num_blocks], fits (checked)
    size = len(ids) * block_tokens
    if out is None:
        flat = np.empty(size, dtype=np.int32)
    elif out.dtype != np.int32 or out.ndim != 1 or not out.flags.c_contiguous or len(out) < size:
        raise ValueError(f"out must be a contiguous int32 array of at least {size} elements")
    else:
        flat = out[:size]
    # the block's offsets first: the inner loop then runs over contiguous memory
    np.add(_offsets(block_tokens), base[:, None], out=flat.reshape(len(ids), block_tokens))
    return flat[:input_length]


_OFFSETS: dict[int, np.ndarray] = {}


def _offsets(block_tokens: int) -> np.ndarray:
    """0, 1, ..., block_tokens - 1 as int32 (read-only, one per block size)."""
    arr = _OFFSETS.get(block_tokens)
    if arr is None:
        arr = _OFFSETS[block_tokens] = np.arange(block_tokens, dtype=np.int32)
        arr.flags.writeable = False
    return arr


def byte_tokenize(text: str) -> np.ndarray:
    """Tokenizer-free, deterministic tokens: the UTF-8 bytes of `text` (int32 ids 0..255)."""
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)


# ---------------------------------------------------------------- requests


class HashedPrompt(NamedTuple):
    """A prompt given as block hash ids, expanded to tokens only when needed."""

    hash_ids: np.ndarray  # int64 [num_blocks]
    input_length: int
    block_tokens: int


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace. `prompt` is explicit tokens (int32 [L]) or a HashedPrompt."""

    arrival_s: float
    prompt: np.ndarray | HashedPrompt
    max_tokens: int
    session: str | None = None

    @property
    def num_prompt_tokens(self) -> int:
        p = self.prompt
        return p.input_length if isinstance(p, HashedPrompt) else len(p)

    def tokens(self, out: np.ndarray | None = None) -> np.ndarray:
        """Prompt tokens, int32 [num_prompt_tokens] (hash ids are expanded on each call; into
        the int32 scratch array `out` when given and large enough, see `expand_hash_ids`)."""
        p = self.prompt
        if isinstance(p, HashedPrompt):
            if out is not None and len(out) < len(p.hash_ids) * p.block_tokens:
                out = None
            return expand_hash_ids(p.hash_ids, p.input_length, p.block_tokens, out)
        return p


class Trace(NamedTuple):
    requests: list[TraceRequest]  # in file order
    format: TraceFormat
    skipped: int  # malformed records skipped under skip_bad
    block_tokens: int | None  # hash-id block size (Mooncake 512, WEKA 64); None for token traces
    first_error: str | None = None  # the first skipped record's error (file:line and field), if any


# ---------------------------------------------------------------- readers


def _parse_radixkv(f: RecordFields) -> TraceRequest:
    if f.has("tokens"):
        tokens = f.int_list("tokens", nonempty=True).astype(np.int32)
    elif f.has("text"):
        text = f.record["text"]
        if not isinstance(text, str) or not text:
            raise f.fail("text", "expected a non-empty string")
        tokens = byte_tokenize(text)
        if len(tokens) > MAX_REQUEST_TOKENS:
            raise f.fail("text", f"{len(tokens):,} bytes, more than {MAX_REQUEST_TOKENS:,} (2**24 tokens a request)")
    else:
        raise f.fail("tokens", "missing (give 'tokens' or 'text')")
    session = f.record.get("session")
    if session is not None and not isinstance(session, (str, int)):
        raise f.fail("session", f"expected a string, got {session!r}")
    return TraceRequest(arrival_s=f.number("arrival_s", default=0.0), prompt=tokens,
                        max_tokens=f.length("max_tokens", minimum=1, default=1),
                        session=None if session is None else str(session))


def read_radixkv(path: str | Path, skip_bad: bool = False) -> Trace:
    """Our JSONL: `arrival_s`, `session`, `tokens` or `text`, `max_tokens` (file order kept)."""
    path = Path(path)
    reqs, skipped, first = collect_records(path, json_lines(path, skip_bad), _parse_radixkv, skip_bad)
    return Trace(reqs, TraceFormat.RADIXKV, skipped, None, first)


class _FreshIds:
    """Hands out block ids above every id a trace uses, for content that is nobody else's."""

    def __init__(self, start: int) -> None:
        self.next = start

    def take(self, n: int) -> np.ndarray:
        ids = np.arange(self.next, self.next + n, dtype=np.int64)
        self.next += n
        return ids


def fill_tails(requests: list[TraceRequest], first_free_id: int) -> list[TraceRequest]:
    """Give every block a HashedPrompt lacks (its uncovered tail) a fresh, unshared id."""
    fresh = _FreshIds(first_free_id)
    out = []
    for r in requests:
        p = r.prompt
        if isinstance(p, HashedPrompt):
            missing = -(-p.input_length // p.block_tokens) - len(p.hash_ids)
            if missing:
                p = p._replace(hash_ids=np.concatenate([p.hash_ids, fresh.take(missing)]))
                r = TraceRequest(r.arrival_s, p, r.max_tokens, r.session)
        out.append(r)
    return out


def hashed_prompt(f: RecordFields, ids_field: str, length_field: str, block_tokens: int) -> HashedPrompt:
    """Hash ids + length; fewer ids than blocks is allowed (the tail is filled later), more is not."""
    ids = f.int_list(ids_field, nonempty=False, upper=1 << 63)
    length = f.length(length_field, minimum=1)
    need = -(-length // block_tokens)
    if len(ids) > need:
        raise f.fail(ids_field, f"{len(ids)} ids for {length_field}={length} "
                                f"(at most {need} blocks of {block_tokens} tokens)")
    return HashedPrompt(ids, length, block_tokens)


def first_free_id(requests: list[TraceRequest]) -> int:
    """One past the largest hash id the requests use (0 when they use none)."""
    ids = [r.prompt.hash_ids for r in requests]
    return int(np.concatenate(ids).max()) + 1 if ids and any(len(i) for i in ids) else 0


def compact_ids(requests: list[TraceRequest], block_tokens: int, where: Any) -> list[TraceRequest]:
    """Renumber hash ids densely (0, 1, ... by value) when they, plus the fresh tail ids still
    to come, would not fit int32 tokens; equal ids stay equal, different stay different.
    TraceError naming `where` (the trace) when even dense ids do not fit: more distinct content
    than 2**31 int32 tokens can tell apart."""
    tails = sum(-(-r.prompt.input_length // block_tokens) - len(r.prompt.hash_ids) for r in requests)
    if first_free_id(requests) + tails <= TOKEN_SPACE // block_tokens:
        return requests
    distinct, dense = np.unique(np.concatenate([r.prompt.hash_ids for r in requests]), return_inverse=True)
    if len(distinct) + tails > TOKEN_SPACE // block_tokens:
        raise TraceError(where, None, None, f"{len(distinct) + tails:,} distinct {block_tokens}-token blocks "
                                            f"({(len(distinct) + tails) * block_tokens:,} tokens of different "
                                            f"content), more than int32 tokens can tell apart "
                                            f"({TOKEN_SPACE // block_tokens:,} blocks); replay part of the trace")
    bounds = np.cumsum([len(r.prompt.hash_ids) for r in requests])[:-1]
    return [TraceRequest(r.arrival_s, r.prompt._replace(hash_ids=ids.astype(np.int64)), r.max_tokens, r.session)
            for r, ids in zip(requests, np.split(dense, bounds))]


def read_mooncake(path: str | Path, skip_bad: bool = False) -> Trace:
    """Mooncake JSONL: `timestamp` ms, `input_length`, `output_length`, 512-token `hash_ids`."""
    path = Path(path)

    def parse(f: RecordFields) -> TraceRequest:
        prompt = hashed_prompt(f, "hash_ids", "input_length", MOONCAKE_BLOCK_TOKENS)
        # output_length 0 (prefill only) still samples the first token, as a server does
        return TraceRequest(arrival_s=f.number("timestamp") / 1000.0, prompt=prompt,
                            max_tokens=max(f.length("output_length", minimum=0, default=1), 1))

    reqs, skipped, first = collect_records(path, json_lines(path, skip_bad), parse, skip_bad)
    reqs = compact_ids(reqs, MOONCAKE_BLOCK_TOKENS, path)
    return Trace(fill_tails(reqs, first_free_id(reqs)), TraceFormat.MOONCAKE, skipped, MOONCAKE_BLOCK_TOKENS,
                 first)


def write_trace(path: str | Path, requests: Iterable[TraceRequest]) -> int:
    """Write requests as radixkv JSONL (tokens spelled out); returns how many were written."""
    n = 0
    with Path(path).open("w", encoding="utf-8") as f:
        for r in requests:
            rec: dict[str, Any] = {"arrival_s": round(float(r.arrival_s), 6)}
            if r.session is not None:
                rec["session"] = r.session
            rec["tokens"] = r.tokens().tolist()
            rec["max_tokens"] = int(r.max_tokens)
            f.write(json.dumps(rec, separators=(",", ":")) + "\n")
            n += 1
    return n


def record_requests(path: str | Path, requests: Iterable[Any]) -> int:
    """Write served `radixkv.request.Request`s (prompt, max_tokens, arrival_s, namespace as the
    session) as radixkv JSONL, so recorded traffic can be replayed. Returns how many were written."""
    return write_trace(path, (TraceRequest(float(r.arrival_s), np.asarray(r.prompt, dtype=np.int32),
                                           int(r.max_tokens), r.namespace) for r in requests))
