"""A tensor-parallel step handed to a worker: pickle of the Batch (the old way) vs tp_frames' raw arrays.

Per step shape: encode (rank 0), decode (the worker), bytes, and the hand-off through a real Pipe to a
forked process (send, the worker's receive + decode, a one-byte answer back: what a worker waits before its
forward can start). Frames are timed cold (every page id converted: rank 0's first step of these requests)
and warm (rank 0's PageTables from the previous step, where 1 row in 16 gained a page, as in decode).
No GPU, no model: host work only.

    python benchmarks/engine/bench_tp_frames.py [--rows 256] [--context 32768] [--reps 20]
"""
from __future__ import annotations

import argparse
import dataclasses
import multiprocessing as mp
import pickle
import statistics
import time
from collections.abc import Callable

import numpy as np

from radixkv.batch import Batch
from radixkv.engine.tp_frames import (
    PageTables,
    StepReader,
    decode_step,
    encode_step,
    is_step,
)

PAGE_SIZE = 16


def make_step(rows: int, context: int, q_len: int, seed: int = 0) -> Batch:
    """`rows` rows each at `context` tokens once the step has run, q_len new tokens each (1: decode)."""
    rng = np.random.default_rng(seed)
    need = -(-context // PAGE_SIZE)
    pages = rng.permutation(rows * need + rows).astype(np.int64)
    tables = [pages[b * need:(b + 1) * need].tolist() for b in range(rows)]
    pos = np.arange(context - q_len, context, dtype=np.int64)
    slots, positions = [], []
    for t in tables:
        slots += (np.asarray(t)[pos // PAGE_SIZE] * PAGE_SIZE + pos % PAGE_SIZE).tolist()
        positions += pos.tolist()
    ids = rng.integers(0, 128_000, rows * q_len).tolist()
    return Batch([None] * rows, ids, positions, list(range(0, rows * q_len, q_len)), [q_len] * rows,  # type: ignore[list-item]
                 [context] * rows, tables, slots, [True] * rows, PAGE_SIZE)


def timed(fn: Callable[[], object], reps: int) -> float:
    """Median ms of fn over reps runs."""
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out) * 1e3


def _worker(conn) -> None:
    reader = StepReader()
    while True:
        try:
            buf = reader.recv(conn)
        except EOFError:
            return
        if is_step(buf):
            decode_step(buf)
        else:
            pickle.loads(buf)
        conn.send_bytes(b"k")


def hand_off(conn, payload: bytes | bytearray, reps: int) -> float:
    def once() -> None:
        conn.send_bytes(payload)
        conn.recv_bytes()

    return timed(once, reps)


def measure(batch: Batch, reps: int) -> list[tuple[str, float, float, bytes | bytearray]]:
    """(way, encode ms, decode ms, payload) of one step: pickle, frames cold, frames warm."""
    remote = dataclasses.replace(batch, requests=[None] * len(batch.requests))
    old = pickle.dumps((1, True, remote), protocol=pickle.HIGHEST_PROTOCOL)
    out = [("pickle (old)", timed(lambda: pickle.dumps((1, True, remote), protocol=pickle.HIGHEST_PROTOCOL), reps),
            timed(lambda: pickle.loads(old), reps), old)]
    new = encode_step(1, True, batch)
    cold = timed(lambda: encode_step(1, True, batch, PageTables()), reps)
    tables = PageTables()
    encode_step(1, True, batch, tables)
    steps = iter(range(2, 1 << 30))

    def warm() -> None:  # the next step: the same page lists, 1 row in 16 (in turn) one page longer
        n = next(steps)
        for t in batch.page_tables[n % 16::16]:
            t.append(t[-1])
        encode_step(n, True, batch, tables)

    warm_ms = timed(warm, reps)
    buf = bytearray(new)
    dec = timed(lambda: decode_step(memoryview(buf)), reps)
    return out + [("frames, cold", cold, dec, new), ("frames, warm", warm_ms, dec, new)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    R, C = args.rows, args.context
    shapes = [(f"{R} rows x {C // 1024}k new tokens, {C // 1024}k context", C // R, C),
              (f"{R}-row decode, {C // 1024}k context", 1, C),
              (f"{R}-row decode, 1k context", 1, 1024)]
    ours, theirs = mp.get_context("fork").Pipe(duplex=True)
    proc = mp.get_context("fork").Process(target=_worker, args=(theirs,), daemon=True)
    proc.start()
    print("| step | way | encode ms | decode ms | MB | hand-off ms |\n|---|---|--:|--:|--:|--:|")
    for name, q_len, context in shapes:
        for way, enc, dec, payload in measure(make_step(R, context, q_len), args.reps):
            pipe = hand_off(ours, payload, args.reps)
            print(f"| {name} | {way} | {enc:.2f} | {dec:.2f} | {len(payload) / 1e6:.2f} | {pipe:.2f} |")
            name = ""
    ours.close()
    proc.join(5)


if __name__ == "__main__":
    main()
