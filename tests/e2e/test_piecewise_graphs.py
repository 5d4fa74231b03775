"""Piecewise graphs of mixed steps (engine/piecewise_graphs.py): buckets, padding, and the pieces (run eagerly
on the CPU, with attention between them) giving LlamaModel.hidden's residual stream; the mixed-step split of
PagedAttention (decode rows through paged_decode) against the reference. The graphs themselves are checked on
the H200 by benchmarks/engine/mixed_step.py (graph logits vs eager, greedy tokens)."""
from __future__ import annotations

import itertools
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is first imported

import numpy as np
import pytest
import torch

from radixkv import LLM
from radixkv.batch import Batch
from radixkv.engine.attention import Backend, PagedAttention, leading_decode_rows
from radixkv.engine.kv_store import KVStore
from radixkv.engine.piecewise_graphs import (
    MixedGraphs,
    bucket_for,
    fill_inputs,
    token_buckets,
)
from radixkv.request import Request

from .tiny_models import tiny_config

PS, PAGES = 4, 32  # page size, pages of the pool (page PAGES is the scratch page)


def test_token_buckets() -> None:
    b = token_buckets(8192)
    assert b[:7] == [16, 32, 64, 128, 160, 192, 224] and b[-1] == 1024 and 512 in b and 576 in b and 544 not in b
    assert b == sorted(set(b)) and all(x % 16 == 0 for x in b)
    assert all(nxt - cur <= cur // 4 for cur, nxt in itertools.pairwise(b) if cur >= 128)  # padding at most 25% past 128
    assert token_buckets(100) == [16, 32, 64, 112] and token_buckets(16) == [16] and token_buckets(1) == [16]
    assert token_buckets(8192, largest=2048)[-1] == 2048
    assert bucket_for(b, 1) == 16 and bucket_for(b, 97) == 128 and bucket_for(b, 1024) == 1024
    assert bucket_for(b, 1025) is None
    with pytest.raises(ValueError):
        token_buckets(0)


def test_padding_tokens_store_to_the_scratch_slot() -> None:
    buf = np.full(4 * 32, -1, dtype=np.int64)
    fill_inputs(buf, 32, 16, [5, 6, 7], [10, 11, 0], [40, 41, 8], scratch_slot=99, sample=[1, 2])
    ids, pos, slots = buf[:32], buf[32:64], buf[64:96]
    assert buf[96:99].tolist() == [1, 2, -1]
    assert ids[:16].tolist() == [5, 6, 7] + [0] * 13 and pos[:16].tolist() == [10, 11, 0] + [0] * 13
    assert slots[:16].tolist() == [40, 41, 8] + [99] * 13
    assert (ids[16:] == -1).all()  # past the bucket: untouched, never read
    with pytest.raises(ValueError):
        fill_inputs(buf, 32, 2, [1, 2, 3], [0, 1, 2], [0, 1, 2], 99)


def test_leading_decode_rows() -> None:
    assert leading_decode_rows([1, 1, 1, 7, 1]) == 3
    assert leading_decode_rows([5, 1]) == 0 and leading_decode_rows([1, 1]) == 2 and leading_decode_rows([]) == 0


def _batch(rows: list[tuple[int, int]], tables: list[list[int]], gen: torch.Generator) -> Batch:
    """rows: (tokens already cached, new tokens) a request."""
    ids, pos, slots, q_start = [], [], [], []
    for (prev, n), table in zip(rows, tables):
        q_start.append(len(ids))
        ids += torch.randint(3, 100, (n,), generator=gen).tolist()
        pos += list(range(prev, prev + n))
        slots += [table[p // PS] * PS + p % PS for p in range(prev, prev + n)]
    seq = [p + n for p, n in rows]
    reqs = [Request(rid=i, prompt=[1] * s, max_tokens=4) for i, s in enumerate(seq)]
    b = Batch(reqs, ids, pos, q_start, [n for _, n in rows], seq, [t[: -(-s // PS)] for t, s in zip(tables, seq)],
              slots, [True] * len(rows), PS)
    b.check()
    return b


@pytest.mark.parametrize("backend", [Backend.REFERENCE, Backend.TRITON])  # TRITON on CPU: the interpreter
def test_pieces_give_the_eager_residual_stream(backend: Backend) -> None:
    llm = LLM(tiny_config("qwen3"), dtype="float32", num_pages=16)
    model = llm.runner.model
    s = model.shard_spec

    def front() -> PagedAttention:
        kv = KVStore(s.num_layers, PAGES + 1, PS, s.num_kv_heads, s.head_dim, "fp32", "cpu")
        return PagedAttention(kv, s.num_q_heads, s.head_dim, s.head_dim ** -0.5, backend)

    eager, piecewise = front(), front()
    mg = MixedGraphs(model, piecewise, max_tokens=64, scratch_page=PAGES, use_graphs=False)
    assert mg.buckets == [16, 32, 64]
    gen = torch.Generator().manual_seed(0)
    tables = [[3, 9, 4, 20], [7, 1, 30, 12], [5, 6, 2, 8], [11, 13, 14, 15], [16, 17, 18, 19]]
    steps = [[(0, 5), (0, 9), (0, 3)],  # a prefill step (no decode rows)
             [(5, 1), (9, 1), (3, 1), (0, 7), (0, 4)],  # decode rows first, then two chunks
             [(6, 1), (10, 1), (4, 1), (7, 6), (4, 1)]]  # a one-token chunk after a longer one
    for rows in steps:
        batch = _batch(rows, tables[:len(rows)], gen)
        eager.plan(batch)
        ids, pos = torch.tensor(batch.input_ids), torch.tensor(batch.positions)
        try:
            want = model.hidden(ids, pos, eager)
            got = mg.hidden(batch)
        except RuntimeError as e:
            if "compiled mode" in str(e):
                pytest.skip("Triton was imported before TRITON_INTERPRET=1 could be set")
            raise
        split = piecewise.current_plan.split
        assert (split.rows if split is not None else 0) == (3 if backend is Backend.TRITON and rows[0][1] == 1 else 0)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    for layer in range(s.num_layers):  # the same pages written (padding tokens only into the scratch page)
        torch.testing.assert_close(piecewise.kv.k_cache[layer][:PAGES], eager.kv.k_cache[layer][:PAGES])
        torch.testing.assert_close(piecewise.kv.v_cache[layer][:PAGES], eager.kv.v_cache[layer][:PAGES])
    assert mg.replays == 3 and mg.num_graphs == 0 and mg.fits(batch)
    logits = mg.run(batch)
    assert logits.shape == (5, model.vocab_rows)
    last = torch.tensor([batch.q_start[b] + batch.q_lens[b] - 1 for b in range(5)])
    torch.testing.assert_close(logits, model.logits(model.hidden(ids, pos, eager)[last]), atol=1e-4, rtol=1e-4)


def test_cpu_engine_builds_no_mixed_graphs() -> None:
    assert LLM(tiny_config("llama"), dtype="float32").runner.mixed_graphs is None
