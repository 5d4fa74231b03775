"""PagedAttention (plan once, run per layer) over a multi-step schedule vs dense attention."""
import math

import pytest
import torch

from kv_fixtures import dense_attention
from radixkv.engine.attention import Backend, PagedAttention, Path
from radixkv.batch import Batch
from radixkv.engine.kv_store import KVStore
from radixkv.request import Request


def make_batch(page_tables, prev_lens, new_lens, page_size):
    reqs = [Request(rid=i, prompt=[1] * max(1, p + n), max_tokens=4) for i, (p, n) in enumerate(zip(prev_lens, new_lens))]
    q_start, positions, slots, start = [], [], [], 0
    for b, (p, n) in enumerate(zip(prev_lens, new_lens)):
        q_start.append(start)
        for pos in range(p, p + n):
            positions.append(pos)
            slots.append(page_tables[b][pos // page_size] * page_size + pos % page_size)
        start += n
    seq_lens = [p + n for p, n in zip(prev_lens, new_lens)]
    batch = Batch(requests=reqs, input_ids=[0] * start, positions=positions, q_start=q_start,
                  q_lens=list(new_lens), seq_lens=seq_lens,
                  page_tables=[pt[: -(-s // page_size)] for pt, s in zip(page_tables, seq_lens)],
                  slots=slots, sample=[True] * len(reqs), page_size=page_size)
    batch.check()
    return batch


@pytest.mark.parametrize("backend,kv_dtype,tol", [
    (Backend.REFERENCE, "fp32", 1e-5), (Backend.REFERENCE, "fp8_e4m3", 0.1),
    (Backend.TRITON, "fp32", 1e-5), (Backend.TRITON, "fp16", 5e-3)])  # TRITON on CPU = interpreter
def test_steps_match_dense(backend, kv_dtype, tol):
    gen = torch.Generator().manual_seed(1)
    page_size, hkv, hq, d, layers = 4, 2, 4, 16, 2
    kv = KVStore(layers, 16, page_size, hkv, d, kv_dtype, "cpu")
    attn = PagedAttention(kv, hq, d, 1 / math.sqrt(d), backend=backend)
    tables = [[9, 2, 14, 5], [0, 11, 7, 3]]
    # step 1: prefill 6 and 3 tokens; step 2: mixed (chunk of 5 + decode); steps 3-4: decode
    schedule = [([0, 0], [6, 3]), ([6, 3], [5, 1]), ([11, 4], [1, 1]), ([12, 5], [1, 1])]
    hist_k = [[torch.empty(0, hkv, d) for _ in range(2)] for _ in range(layers)]
    hist_v = [[torch.empty(0, hkv, d) for _ in range(2)] for _ in range(layers)]
    for prev, new in schedule:
        attn.plan(make_batch(tables, prev, new, page_size))
        assert attn.current_plan.path is (Path.DECODE if new == [1, 1] else Path.PREFILL)
        T = sum(new)
        for layer in range(layers):
            q = torch.randn(T, hq, d, generator=gen)
            k = torch.randn(T, hkv, d, generator=gen)
            v = torch.randn(T, hkv, d, generator=gen)
            out = attn.run(q, k, v, layer)
            assert out.shape == q.shape and out.dtype == q.dtype
            s = 0
            for b, n in enumerate(new):
                hist_k[layer][b] = torch.cat([hist_k[layer][b], k[s:s + n]])
                hist_v[layer][b] = torch.cat([hist_v[layer][b], v[s:s + n]])
                want = dense_attention(q[s:s + n], hist_k[layer][b], hist_v[layer][b], 1 / math.sqrt(d))
                torch.testing.assert_close(out[s:s + n].double(), want, atol=tol, rtol=tol)
                s += n


@pytest.mark.parametrize("kv_dtype", ["fp8_e4m3", "fp8_e5m2"])
def test_triton_fp8_store_reads_its_own_pages(kv_dtype):
    """The Triton backend over KVStore's FP8 layout (head-major pages, float16 scales): each step's
    output equals dense attention over the dequantised values the store holds for those tokens, and
    those values are the written K/V up to FP8 rounding (the interpreter's FP8 casts round differently
    from the GPU's, so the store is checked loosely and the attention exactly over what it holds)."""
    gen = torch.Generator().manual_seed(2)
    page_size, hkv, hq, d = 4, 2, 4, 16
    kv = KVStore(1, 16, page_size, hkv, d, kv_dtype, "cpu")
    attn = PagedAttention(kv, hq, d, 1 / math.sqrt(d), backend=Backend.TRITON)
    tables = [[9, 2, 14, 5], [0, 11, 7, 3]]
    written = [torch.empty(0, hkv, d) for _ in range(2)]
    for prev, new in [([0, 0], [6, 3]), ([6, 3], [5, 1]), ([11, 4], [1, 1])]:
        attn.plan(make_batch(tables, prev, new, page_size))
        q = torch.randn(sum(new), hq, d, generator=gen)
        k = torch.randn(sum(new), hkv, d, generator=gen)
        out = attn.run(q, k, k * 0.5, 0)
        s = 0
        for b, n in enumerate(new):
            written[b] = torch.cat([written[b], k[s:s + n]])
            pos = torch.arange(prev[b] + n)
            pages, slots = torch.tensor(tables[b])[pos // page_size], pos % page_size
            held_k = kv.k_cache[0][pages, slots].float() * kv.k_scale[0][pages, slots].float()[..., None]
            held_v = kv.v_cache[0][pages, slots].float() * kv.v_scale[0][pages, slots].float()[..., None]
            for held, want_kv in ((held_k, written[b]), (held_v, 0.5 * written[b])):
                assert (held - want_kv).norm() / want_kv.norm() < 0.15  # FP8 rounding, not a wrong slot
            want = dense_attention(q[s:s + n], held_k, held_v, 1 / math.sqrt(d))
            torch.testing.assert_close(out[s:s + n].double(), want, atol=1e-4, rtol=1e-4)
            s += n


def test_run_before_plan_and_bad_shapes():
    kv = KVStore(1, 4, 2, 1, 8, "fp32", "cpu")
    attn = PagedAttention(kv, 2, 8, 0.5)
    with pytest.raises(RuntimeError, match="plan"):
        attn.run(torch.zeros(1, 2, 8), torch.zeros(1, 1, 8), torch.zeros(1, 1, 8), 0)
    attn.plan(make_batch([[3]], [0], [2], 2))
    with pytest.raises(ValueError, match="q shape"):
        attn.run(torch.zeros(1, 2, 8), torch.zeros(2, 1, 8), torch.zeros(2, 1, 8), 0)
    with pytest.raises(ValueError, match="layer"):
        attn.run(torch.zeros(2, 2, 8), torch.zeros(2, 1, 8), torch.zeros(2, 1, 8), 1)
    with pytest.raises(ValueError, match="num_kv_heads"):
        PagedAttention(KVStore(1, 4, 2, 2, 8, "fp32", "cpu"), 3, 8, 0.5)


def test_plan_takes_the_split_count_from_dispatch(monkeypatch):
    """plan() asks dispatch.choose_num_splits on decode-only steps (with the warps per SM that
    dispatch.decode_warps_per_sm gave at construction) and uses one split otherwise."""
    from radixkv.kernels import dispatch

    calls = []

    def fake(batch_size, num_kv_heads, max_seq_len, num_sms=dispatch.DEFAULT_NUM_SMS, warps_per_sm=0, **kw):
        calls.append((batch_size, num_kv_heads, max_seq_len, num_sms, warps_per_sm))
        return 3

    monkeypatch.setattr(dispatch, "choose_num_splits", fake)
    kv = KVStore(1, 8, 4, 2, 16, "fp8_e4m3", "cpu")
    attn = PagedAttention(kv, 4, 16, 0.25, backend=Backend.TRITON)  # CPU: not the Gluon kernel
    attn.plan(make_batch([[1, 2], [3, 4]], [0, 0], [5, 2], 4))
    assert attn.current_plan.num_splits == 1 and calls == []  # prefill
    attn.plan(make_batch([[1, 2], [3, 4]], [5, 2], [1, 1], 4))
    assert attn.current_plan.num_splits == 3
    assert calls == [(2, 2, 6, dispatch.DEFAULT_NUM_SMS, 0)]


@pytest.mark.parametrize("static_out", [True, False])
def test_a_mixed_step_checks_its_launch_once_and_every_layer_reuses_it(static_out):
    """A mixed step (decode rows first: MixedSplit) attending at every layer through the same q / out buffers,
    as the piecewise graphs do, or with a new output each layer, as the eager forward does: one launch is built
    for the step (kernels.decode_launcher + prefill_launcher), each layer reads its own caches, and every
    layer's output matches dense attention."""
    gen = torch.Generator().manual_seed(2)
    page_size, hkv, hq, d, layers = 4, 2, 4, 16, 3
    kv = KVStore(layers, 16, page_size, hkv, d, "fp32", "cpu")
    attn = PagedAttention(kv, hq, d, 1 / math.sqrt(d), backend=Backend.TRITON)
    tables = [[9, 2, 14, 5], [0, 11, 7, 3]]
    prefix = [torch.randn(layers, 2, 6, hkv, d, generator=gen) for _ in range(2)]  # [layer, k/v, token, ...]
    attn.plan(make_batch(tables, [0, 0], [6, 6], page_size))
    for layer in range(layers):
        attn.store(prefix[0][layer, 0].clone(), prefix[0][layer, 1].clone(), layer, attn.current_plan.slots[:6])
        attn.store(prefix[1][layer, 0].clone(), prefix[1][layer, 1].clone(), layer, attn.current_plan.slots[6:])
    attn.plan(make_batch(tables, [6, 6], [1, 5], page_size))  # row 0 decodes, row 1 a chunk of 5
    assert attn.current_plan.split is not None and attn.current_plan.split.rows == 1
    q_buf, out_buf = torch.empty(6, hq, d), torch.empty(6, hq, d)
    for layer in range(layers):
        q_buf.copy_(torch.randn(6, hq, d, generator=gen))
        k, v = torch.randn(6, hkv, d, generator=gen), torch.randn(6, hkv, d, generator=gen)
        attn.store(k, v, layer, attn.current_plan.slots)
        got = attn.attend(q_buf, layer, out=out_buf if static_out else None)
        assert (got is out_buf) == static_out
        for b, (lo, hi) in enumerate(((0, 1), (1, 6))):
            keys = torch.cat([prefix[b][layer, 0], k[lo:hi]])
            vals = torch.cat([prefix[b][layer, 1], v[lo:hi]])
            want = dense_attention(q_buf[lo:hi], keys, vals, 1 / math.sqrt(d))
            torch.testing.assert_close(got[lo:hi].double(), want, atol=1e-5, rtol=1e-5)
    assert len(attn._launches) == 1


@pytest.mark.parametrize("kv_dtype", ["fp8_e4m3", "int4"])
def test_a_quantised_mixed_step_lists_its_extend_rows_distinct_pages(kv_dtype, monkeypatch):
    """plan() of a mixed step over FP8 / INT4 pages lists the distinct pages of the rows paged_prefill runs (not
    the leading decode row's) for dequant_page_list, with the table over them; on a stand-in Hopper kernel the
    step reads the fp16 copies, and every layer's output equals the in-kernel widening's (plan without copies)."""
    import sys
    import types

    from radixkv.kernels import dispatch, prefill
    from radixkv.kernels.launch import LOG2E
    from radixkv.kernels.reference_attention import paged_prefill_ref

    handed = []

    def fake_launch(q, k_cache, v_cache, page_table, seq_lens, q_start, q_lens, qk_scale, max_q_len, out,
                    k_scale=None, v_scale=None, lse=None):
        handed.append(k_cache.dtype)
        out.copy_(paged_prefill_ref(q, k_cache, v_cache, page_table, seq_lens, q_start, q_lens, qk_scale / LOG2E,
                                    k_scale=k_scale, v_scale=v_scale))

    monkeypatch.setitem(sys.modules, "radixkv.kernels.prefill_hopper_gluon", types.SimpleNamespace(launch=fake_launch))
    monkeypatch.setattr(prefill, "hopper_prefill_supported", lambda *a, **k: True)
    monkeypatch.setattr(dispatch, "extend_copies_wanted", lambda *a: True)
    gen = torch.Generator().manual_seed(4)
    page_size, hkv, hq, d, layers = 4, 2, 4, 32, 2
    kv = KVStore(layers, 24, page_size, hkv, d, kv_dtype, "cpu")
    attn = PagedAttention(kv, hq, d, 1 / math.sqrt(d), backend=Backend.TRITON)
    tables = [[20, 21], [9, 2, 14, 5, 1], [9, 2, 14, 5, 3], [9, 2, 14, 5, 6]]  # rows 1-3 share 4 pages
    attn.plan(make_batch(tables, [0] * 4, [5, 16, 16, 16], page_size))
    for layer in range(layers):
        attn.store(torch.randn(53, hkv, d, generator=gen), torch.randn(53, hkv, d, generator=gen), layer,
                   attn.current_plan.slots)
    attn.plan(make_batch(tables, [5, 16, 16, 16], [1, 4, 4, 4], page_size))  # row 0 decodes, rows 1-3 extend
    plan = attn.current_plan
    assert plan.split is not None and plan.split.rows == 1
    assert plan.copies.pages.tolist() == [1, 2, 3, 5, 6, 9, 14] and plan.copies.reads == 15
    assert plan.copies.pages[plan.copies.table.long()][:, :5].tolist() == tables[1:]
    for layer in range(layers):
        attn.store(torch.randn(13, hkv, d, generator=gen), torch.randn(13, hkv, d, generator=gen), layer,
                   plan.slots)
    q = torch.randn(13, hq, d, generator=gen)
    handed.clear()
    got = [attn.attend(q, layer) for layer in range(layers)]
    assert handed == [torch.float16] * layers  # each layer's copies, read by the 16-bit kernel
    attn.install(plan._replace(copies=None))
    for layer in range(layers):
        torch.testing.assert_close(got[layer], attn.attend(q, layer), rtol=2e-3, atol=2e-3)
    assert handed[-1] == kv.k_cache[0].dtype  # without the list: 4 new tokens a row widen in-kernel
    monkeypatch.undo()
    attn.plan(make_batch(tables, [5, 16, 16, 16], [1, 4, 4, 4], page_size))
    assert attn.current_plan.copies is None  # a CPU (no Hopper kernel to read copies): no list
