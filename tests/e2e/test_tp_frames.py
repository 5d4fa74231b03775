"""Tensor-parallel step frames (radixkv/engine/tp_frames.py): a Batch goes to the workers as raw arrays and
comes back out exactly (every field, the page tables, follows, cascade levels), plans the same attention
tensors as the original, and rank 0's page-table cache never serves a stale page. In process: no workers."""
from __future__ import annotations

import multiprocessing
import pickle

import numpy as np
import pytest
import torch

from radixkv.batch import Batch
from radixkv.engine.attention import PagedAttention
from radixkv.engine.kv_store import KVStore
from radixkv.engine.tp_frames import (
    PageTables,
    StepReader,
    Stop,
    decode_step,
    encode_step,
    is_step,
)
from radixkv.scheduler.cascade_groups import RULE_ALWAYS, find_cascade_groups

NUM_PAGES = 4096


def _batch(rows: list[tuple[int, int]], page_size: int, shared_pages: int = 0, seed: int = 0,
           num_pages: int = NUM_PAGES) -> Batch:
    """rows: (seq_len, q_len) each; the first `shared_pages` pages of every row are the same physical ones."""
    rng = np.random.default_rng(seed)
    free = rng.permutation(num_pages).tolist()
    shared = [free.pop() for _ in range(shared_pages)]
    ids, pos, q_start, q_lens, seq_lens, tables, slots, sample = [], [], [], [], [], [], [], []
    for seq, q in rows:
        need = -(-seq // page_size)
        table = shared[:need] + [free.pop() for _ in range(max(0, need - shared_pages))] + [free.pop()]  # spare
        q_start.append(len(ids))
        q_lens.append(q)
        seq_lens.append(seq)
        tables.append(table)
        for p in range(seq - q, seq):
            ids.append(int(rng.integers(0, 50_000)))
            pos.append(p)
            slots.append(table[p // page_size] * page_size + p % page_size)
        sample.append(bool(rng.integers(0, 2)) or q == 1)
    b = Batch([object()] * len(rows), ids, pos, q_start, q_lens, seq_lens, tables, slots, sample,  # type: ignore[list-item]
              page_size)
    b.check()
    return b


def _same(got: Batch, want: Batch, check: bool = True) -> None:
    assert got.requests == [None] * len(want.requests) and got.page_size == want.page_size
    for name, dtype in (("input_ids", np.int64), ("positions", np.int64), ("slots", np.int64)):
        arr = getattr(got, name)
        assert isinstance(arr, np.ndarray) and arr.dtype == dtype and arr.flags.writeable, name
        assert arr.tolist() == getattr(want, name), name
    for name in ("q_start", "q_lens", "seq_lens", "sample", "follows"):
        assert getattr(got, name) == getattr(want, name), name
        assert type(getattr(got, name)) is type(getattr(want, name)), name
    assert all(p.dtype == np.int32 for p in got.page_tables)
    assert [p.tolist() for p in got.page_tables] == want.page_tables
    assert got.cascade == want.cascade
    assert got.is_decode_only == want.is_decode_only
    if check:
        got.check()


def _round_trip(batch: Batch, tables: PageTables | None = None, number: int = 7, graphs: bool = True,
                check: bool = True) -> Batch:
    buf = encode_step(number, graphs, batch, tables)
    assert is_step(buf) and len(buf) % 8 == 0
    step = decode_step(memoryview(buf))
    assert (step.number, step.use_graphs) == (number, graphs)
    _same(step.batch, batch, check)
    return step.batch


DECODE = [(37, 1), (5, 1), (64, 1), (1, 1)]
MIXED = [(40, 1), (30, 30), (90, 24), (3, 1), (17, 5)]


@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("rows", [DECODE, MIXED], ids=["decode", "mixed"])
def test_a_batch_round_trips_exactly(rows, page_size) -> None:
    _round_trip(_batch(rows, page_size), graphs=False)


def test_follows_and_a_large_step_round_trip() -> None:
    b = _batch(DECODE, 4)
    b.follows = [3, 0, 2, 1]
    b.input_ids = [0] * len(b.input_ids)
    _round_trip(b)
    big = _batch([(32768 - i, 128) for i in range(64)], 16, seed=1, num_pages=1 << 20)  # 64 rows x 128 new tokens, ~2k pages each
    _round_trip(big)


@pytest.mark.parametrize("levels", [1, 2])
def test_cascade_levels_round_trip(levels) -> None:
    ps = 4
    b = _batch([(40 + i, 1) for i in range(8)], ps, shared_pages=6)
    for r in range(8):  # two levels: 6 pages shared by all, over 3 more shared by rows 0..3 and by rows 4..7
        b.page_tables[r][6:9] = b.page_tables[r // 4 * 4][6:9]
    b.slots = [b.page_tables[r][(s - 1) // ps] * ps + (s - 1) % ps for r, s in enumerate(b.seq_lens)]
    b.cascade = find_cascade_groups(b.page_tables, b.seq_lens, ps, rule=RULE_ALWAYS, max_levels=levels)
    assert b.cascade is not None and b.cascade.num_levels == levels
    got = _round_trip(b)
    assert got.cascade.plan_groups() == b.cascade.plan_groups() and got.cascade.plan_outer() == b.cascade.plan_outer()


@pytest.mark.parametrize("rows", [DECODE, MIXED], ids=["decode", "mixed"])
def test_the_decoded_batch_plans_the_same_attention(rows) -> None:
    kv = KVStore(1, NUM_PAGES, 4, 1, 8, "fp32", "cpu")
    want, got = PagedAttention(kv, 2, 8, 0.3), PagedAttention(kv, 2, 8, 0.3)
    b = _batch(rows, 4)
    want.plan(b)
    got.plan(decode_step(encode_step(1, False, b)).batch)
    for name, x in want.current_plan._asdict().items():
        y = getattr(got.current_plan, name)
        if isinstance(x, torch.Tensor):
            assert x.dtype == y.dtype and torch.equal(x, y), name
        else:
            assert x == y and type(x) is type(y), name


def test_page_tables_are_converted_once_and_never_stale() -> None:
    tables = PageTables()
    b = _batch(DECODE, 4)  # the page lists change below without their slots: no Batch.check
    _round_trip(b, tables)
    b.page_tables[0].append(4095)  # a row's list grows (a new page): only its tail is converted
    b.page_tables[1][0] = 4094  # a list changed in place: converted again
    b.page_tables[2].pop()  # shrunk
    _round_trip(b, tables, check=False)
    b.page_tables[3] = list(b.page_tables[3])  # another list, equal content
    _round_trip(b, tables, check=False)
    b.page_tables[3] = b.page_tables[0]  # one list in two rows, then grown: both rows see the new page
    _round_trip(b, tables, check=False)
    b.page_tables[0].append(4093)
    _round_trip(b, tables, check=False)
    b.page_tables = [np.asarray(p, dtype=np.int64) for p in b.page_tables]  # arrays are taken as they are
    got = decode_step(encode_step(3, True, b, tables)).batch
    assert [p.tolist() for p in got.page_tables] == [p.tolist() for p in b.page_tables]


def test_the_reader_grows_and_tells_steps_from_control_messages() -> None:
    ours, theirs = multiprocessing.Pipe(duplex=True)
    reader = StepReader(size=64)
    small, big = _batch(DECODE, 4), _batch(MIXED, 1)
    for b in (small, big, small):
        ours.send_bytes(encode_step(1, True, b))
        buf = reader.recv(theirs)
        assert is_step(buf)
        _same(decode_step(buf).batch, b)
    ours.send_bytes(pickle.dumps(Stop()))
    buf = reader.recv(theirs)
    assert not is_step(buf) and isinstance(pickle.loads(buf), Stop)
    ours.close()
    with pytest.raises(EOFError):
        reader.recv(theirs)


def test_a_batch_whose_lengths_disagree_is_refused_before_sending() -> None:
    b = _batch(MIXED, 4)
    b.positions = b.positions[:-1]
    with pytest.raises(ValueError):
        encode_step(1, False, b)
