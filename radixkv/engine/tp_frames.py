"""What goes down and up a tensor-parallel worker's pipe (tp_workers.py): step frames and control messages.

A step is one `send_bytes` buffer, no pickle: a fixed header, a table of (offset, count) a frame, then the
frames, raw little-endian arrays each starting on 8 bytes:

    header       magic b"RKVS", step number, use_graphs, has follows, has cascade, page_size, rows B, tokens T
    input_ids    int64 [T]      positions  int64 [T]      slots     int64 [T]
    q_start      int32 [B]      q_lens     int32 [B]      seq_lens  int32 [B]      sample  bool [B]
    page_lens    int32 [B]      pages      int32 [sum page_lens]: the page tables, row after row
    follows      int64 [K <= B, or 0]
    cascade      int64 [...]    CascadeLevels, flattened (_cascade_words); absent when the batch has none

`decode_step` rebuilds the Batch over the receive buffer without copying the big arrays: input_ids,
positions and slots are int64 numpy arrays and page_tables[b] int32 views (what host_to_device, the CUDA
graphs' fill and the cascade plans read the same as lists); the row fields (q_start, q_lens, seq_lens,
sample, follows) are lists, as on rank 0; requests are [None] * B (workers have no Request objects).
The views live in the worker's receive buffer (StepReader), valid until it reads the next message: nothing
of a step outlives its forward_local (its host arrays are copied to the device or into the graphs' pinned
buffers; on the CPU the attention plan's tensors are views, replaced by the next step's plan before use).

Rank 0 converts page ids to int32 once a request, not once a step: `PageTables` keeps each row's last
array and converts only pages appended since (a step's page lists are the requests' own, Batch docstring;
each is compared with its copy, so a list changed in place is converted again).

Control messages (start-up, failures, stop, test faults) stay small pickled dataclasses; `is_step` tells
a step frame from them by its magic.
"""
from __future__ import annotations

import dataclasses
import enum
import struct
from collections.abc import Sequence
from multiprocessing import BufferTooShort
from typing import Any

import numpy as np

from radixkv.batch import Batch
from radixkv.batch import CascadeGroup, CascadeLevels

MAGIC = b"RKVS"
_HEAD = struct.Struct("<4sq???xIII")  # magic, step number, use_graphs, has follows, has cascade, page_size, B, T
_FRAMES: tuple[tuple[str, Any], ...] = (
    ("input_ids", np.int64), ("positions", np.int64), ("slots", np.int64), ("q_start", np.int32),
    ("q_lens", np.int32), ("seq_lens", np.int32), ("sample", np.bool_), ("page_lens", np.int32),
    ("pages", np.int32), ("follows", np.int64), ("cascade", np.int64))
_TABLE = struct.Struct("<" + "QQ" * len(_FRAMES))  # (byte offset, count) of each frame
_START = -(-(_HEAD.size + _TABLE.size) // 8) * 8
_CODES = {np.int64: "q", np.int32: "i", np.bool_: "?"}  # struct's letter of each frame dtype


class Fault(enum.Enum):
    """Test-only faults a worker acts out at its next step (TensorParallel.inject_fault)."""

    RAISE = "raise"  # raise RuntimeError before the forward
    EXIT = "exit"  # os._exit(7) without a word
    HANG = "hang"  # sleep past any timeout


@dataclasses.dataclass(frozen=True)
class Stop:
    pass


@dataclasses.dataclass(frozen=True)
class InjectFault:
    kind: Fault


@dataclasses.dataclass(frozen=True)
class Hello:
    rank: int
    pid: int


@dataclasses.dataclass(frozen=True)
class Failed:
    rank: int
    error: str  # "Type: message", one line
    traceback: str
    collective: bool  # it was a collective failing (a consequence of another rank's failure, usually)


@dataclasses.dataclass(frozen=True)
class Step:
    number: int
    use_graphs: bool
    batch: Batch  # requests: [None] * B


def line(e: BaseException) -> str:
    """An exception's first non-empty line (at most 300 characters)."""
    lines = [x.strip() for x in str(e).splitlines() if x.strip()]
    return lines[0][:300] if lines else ""


class PageTables:
    """Rank 0's int32 copies of the rows' page lists, from one step to the next (module docstring)."""

    def __init__(self) -> None:
        self._rows: dict[int, tuple[list[int], np.ndarray]] = {}  # id(list) -> (a copy of it, its int32 array)

    def arrays(self, tables: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """Each row's page ids as int32 (struct.error for an id outside int32), read-only. Rows of earlier steps
        that are not in this one are forgotten."""
        kept: dict[int, tuple[list[int], np.ndarray]] = {}
        out = []
        for pages in tables:
            if isinstance(pages, np.ndarray):
                out.append(pages.astype(np.int32, copy=False))
                continue
            key, n = id(pages), len(pages)
            copy, arr = kept.get(key) or self._rows.get(key) or ([], _EMPTY)  # a list twice in a step: its latest
            m = len(copy)
            if m > n or (pages[:m] if m < n else pages) != copy:  # shrunk or changed: start again
                copy, arr, m = [], _EMPTY, 0
            if m < n:
                tail = pages[m:] if m else pages
                new = np.frombuffer(struct.pack(f"<{n - m}i", *tail), np.int32)  # struct unpacks a list faster than np.array
                copy, arr = (copy + list(tail), np.concatenate((arr, new))) if m else (list(pages), new)
            kept[key] = (copy, arr)
            out.append(arr)
        self._rows = kept
        return out


_EMPTY = np.zeros(0, dtype=np.int32)


def encode_step(number: int, use_graphs: bool, batch: Batch, tables: PageTables | None = None) -> bytearray:
    """The step as one buffer (module docstring). ValueError when the batch's lengths disagree."""
    B, T = len(batch.seq_lens), len(batch.input_ids)
    for name, n in (("positions", T), ("slots", T), ("q_start", B), ("q_lens", B), ("page_tables", B),
                    ("sample", B)):
        if len(getattr(batch, name)) != n:
            raise ValueError(f"tensor parallel: a step whose {name} has {len(getattr(batch, name))} entries, "
                             f"not {n}")
    if len(batch.follows or ()) > B:
        raise ValueError(f"tensor parallel: a step whose follows has {len(batch.follows)} entries, more than its "
                         f"{B} rows")
    rows = (tables or PageTables()).arrays(batch.page_tables)
    lens = [len(r) for r in rows]
    follows = batch.follows if batch.follows is not None else ()
    cascade = _cascade_words(batch.cascade) if batch.cascade is not None else ()
    values = (batch.input_ids, batch.positions, batch.slots, batch.q_start, batch.q_lens, batch.seq_lens,
              batch.sample, lens, None, follows, cascade)
    counts = (T, T, T, B, B, B, B, B, sum(lens), len(follows), len(cascade))
    offsets, end = [], _START
    for (_, dtype), count in zip(_FRAMES, counts):
        offsets.append(end)
        end += -(-count * np.dtype(dtype).itemsize // 8) * 8
    buf = bytearray(end)
    _HEAD.pack_into(buf, 0, MAGIC, number, use_graphs, batch.follows is not None, batch.cascade is not None,
                    batch.page_size, B, T)
    _TABLE.pack_into(buf, _HEAD.size, *[x for pair in zip(offsets, counts) for x in pair])
    for (name, dtype), value, offset, count in zip(_FRAMES, values, offsets, counts):
        if not count:
            continue
        if name != "pages" and not isinstance(value, np.ndarray):  # a list: struct packs it fastest
            struct.pack_into(f"<{count}{_CODES[dtype]}", buf, offset, *value)
            continue
        view = np.frombuffer(buf, dtype, count, offset)
        if name != "pages":
            view[:] = value
            continue
        at = 0
        for r in rows:
            view[at:at + len(r)] = r
            at += len(r)
    return buf


def is_step(buf: bytes | bytearray | memoryview) -> bool:
    return bytes(buf[:4]) == MAGIC


def decode_step(buf: bytearray | memoryview) -> Step:
    """The Step of an encode_step buffer; its arrays are views of `buf` (writable when buf is)."""
    magic, number, use_graphs, has_follows, has_cascade, page_size, B, _ = _HEAD.unpack_from(buf, 0)
    if magic != MAGIC:
        raise ValueError(f"not a step frame (magic {magic!r})")
    table = _TABLE.unpack_from(buf, _HEAD.size)
    f = {name: np.frombuffer(buf, dtype, count, offset) if count else np.zeros(0, dtype)
         for (name, dtype), offset, count in zip(_FRAMES, table[0::2], table[1::2])}
    ends = np.cumsum(f["page_lens"]).tolist()
    pages = f["pages"]
    batch = Batch(
        requests=[None] * B,  # type: ignore[list-item]
        input_ids=f["input_ids"], positions=f["positions"],  # type: ignore[arg-type]
        q_start=f["q_start"].tolist(), q_lens=f["q_lens"].tolist(), seq_lens=f["seq_lens"].tolist(),
        page_tables=[pages[a:b] for a, b in zip([0, *ends], ends)],  # type: ignore[misc]
        slots=f["slots"], sample=f["sample"].tolist(), page_size=page_size,  # type: ignore[arg-type]
        cascade=_cascade_levels(f["cascade"].tolist()) if has_cascade else None,
        follows=f["follows"].tolist() if has_follows else None)
    return Step(number, use_graphs, batch)


def _cascade_words(c: CascadeLevels) -> list[int]:
    """[page_size, levels L, len(suffix_start), groups of each level and of one_level (L + 1 counts),
    suffix_start, (rows, page_start, pages) of each group, every group's rows, every group's pages]."""
    levels = [*c.levels, c.one_level]
    groups = [g for level in levels for g in level]
    return [c.page_size, len(c.levels), len(c.suffix_start), *[len(level) for level in levels], *c.suffix_start,
            *[x for g in groups for x in (len(g.rows), g.page_start, len(g.pages))],
            *[r for g in groups for r in g.rows], *[p for g in groups for p in g.pages]]


def _cascade_levels(w: list[int]) -> CascadeLevels:
    page_size, L, B = w[:3]
    sizes, at = w[3:3 + L + 1], 4 + L
    suffix_start, at = tuple(w[at:at + B]), at + B
    n = sum(sizes)
    shapes, at = [w[at + 3 * i:at + 3 * i + 3] for i in range(n)], at + 3 * n
    rows_at, pages_at = at, at + sum(s[0] for s in shapes)
    groups = []
    for n_rows, page_start, n_pages in shapes:
        groups.append(CascadeGroup(tuple(w[rows_at:rows_at + n_rows]), page_start,
                                   tuple(w[pages_at:pages_at + n_pages])))
        rows_at, pages_at = rows_at + n_rows, pages_at + n_pages
    levels, g = [], 0
    for size in sizes:
        levels.append(tuple(groups[g:g + size]))
        g += size
    return CascadeLevels(tuple(levels[:L]), suffix_start, levels[L], page_size)


class StepReader:
    """A worker's receive buffer, reused from step to step (grown when a message does not fit)."""

    def __init__(self, size: int = 1 << 20) -> None:
        self._buf = bytearray(size)

    def recv(self, conn: Any) -> memoryview:
        """The next message as a view of the buffer (valid until the next recv). EOFError when rank 0 is gone."""
        try:
            n = conn.recv_bytes_into(self._buf)
        except BufferTooShort as e:  # the whole message is in e.args[0]
            data = e.args[0]
            self._buf = bytearray(max(len(data), 2 * len(self._buf)))
            self._buf[:len(data)] = data
            n = len(data)
        return memoryview(self._buf)[:n]

