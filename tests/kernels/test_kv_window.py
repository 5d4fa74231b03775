"""The recent-token window: window_attention against its twin, and PagedAttention with a KVWindow over a
multi-step schedule against dense attention in which each query's window keys are exact and older keys
are what the pages hold."""
import math

import pytest
import torch
from radixkv.kernels import reference_attention
from radixkv.kernels.window import window_attention
from test_attention_front import make_batch

from radixkv.engine.attention import Backend, PagedAttention
from radixkv.engine.kv_store import KVStore
from radixkv.engine.kv_window import KVWindow
from radixkv.plan import kv_window_bytes, window_pages_per_row


def _rows(q_lens):
    return torch.repeat_interleave(torch.arange(len(q_lens), dtype=torch.int32), torch.tensor(q_lens))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("window,sink", [(1, 0), (5, 0), (1, 4), (5, 8)])
def test_window_kernel_matches_reference(dtype, window, sink):
    gen = torch.Generator().manual_seed(3)
    ps, hkv, hq, d, shadows = 4, 2, 6, 32, 9
    prev, new = [7, 0, 13], [1, 6, 3]  # a decode row, a first chunk, a later chunk
    tables = torch.tensor([[3, 8, 1, 0], [5, 2, 0, 0], [4, 6, 7, 9]], dtype=torch.int32)
    seq_lens = torch.tensor([p + n for p, n in zip(prev, new)], dtype=torch.int32)
    q_lens = torch.tensor(new, dtype=torch.int32)
    q_start = torch.tensor([0, 1, 7], dtype=torch.int32)
    T = sum(new)
    shadow_of = torch.full((10,), shadows - 1, dtype=torch.int32)
    shadow_of[torch.tensor([3, 8, 1, 5, 4, 6, 7, 9])] = torch.tensor([0, 4, 2, 1, 3, 5, 6, 7], dtype=torch.int32)
    q = torch.randn(T, hq, d, generator=gen).to(dtype)
    k = torch.randn(T, hkv, d, generator=gen).to(dtype)
    v = torch.randn(T, hkv, d, generator=gen).to(dtype)
    sk = torch.randn(shadows, ps, hkv, d, generator=gen).to(dtype)
    sv = torch.randn(shadows, ps, hkv, d, generator=gen).to(dtype)
    args = (shadow_of, tables, seq_lens, q_start, q_lens, _rows(new), window, 0.3, sink)
    sk2, sv2 = sk.clone(), sv.clone()
    o, lse = window_attention(q, k, v, sk, sv, *args)
    o_ref, lse_ref = reference_attention.window_attention_ref(q, k, v, sk2, sv2, *args)
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(o, o_ref, atol=tol, rtol=tol)
    torch.testing.assert_close(lse, lse_ref, atol=tol, rtol=tol)
    torch.testing.assert_close(sk[:-1], sk2[:-1], atol=0, rtol=0)  # scratch page: any of its writers wins
    torch.testing.assert_close(sv[:-1], sv2[:-1], atol=0, rtol=0)


def _held(x, kv_dtype):
    """What a page of kv_dtype holds for rows x [n, Hkv, D] (fp32 math)."""
    kv = KVStore(1, 4, 16, x.shape[1], x.shape[2], kv_dtype, "cpu")
    out = torch.empty(x.shape)
    for s in range(0, x.shape[0], 64):
        part = x[s:s + 64]
        slots = torch.arange(part.shape[0])
        reference_attention.store_kv_ref(part, part, kv.k_cache[0], kv.v_cache[0], slots, *kv.scales(0))
        out[s:s + 64] = reference_attention.gather_pages(kv.k_cache[0], kv.scales(0)[0], torch.arange(4), part.shape[0],
                                               torch.float32, x.shape[2])
    return out


def _windowed_dense(q, k_exact, v_exact, k_held, v_held, exact_from, window, sm_scale, sink=0):
    """q [M, Hq, D], the last M of N keys; key j of query t exact when (t - window < j or j < sink) and
    j >= exact_from."""
    m, hq, d = q.shape
    n, hkv, _ = k_exact.shape
    g = hq // hkv
    out = torch.empty(m, hq, d, dtype=torch.float64)
    for i in range(m):
        t = n - m + i
        j = torch.arange(t + 1)
        exact = ((j > t - window) | (j < sink)) & (j >= exact_from)
        kk = torch.where(exact[:, None, None], k_exact[:t + 1], k_held[:t + 1]).double().repeat_interleave(g, 1)
        vv = torch.where(exact[:, None, None], v_exact[:t + 1], v_held[:t + 1]).double().repeat_interleave(g, 1)
        p = torch.softmax(torch.einsum("hd,jhd->hj", q[i].double(), kk) * sm_scale, dim=-1)
        out[i] = torch.einsum("hj,jhd->hd", p, vv)
    return out


CASES = [(Backend.REFERENCE, "fp32", 1e-5, 0), (Backend.REFERENCE, "int4", 1e-5, 0),
         (Backend.REFERENCE, "fp8_e4m3", 1e-5, 0), (Backend.TRITON, "fp32", 1e-5, 0), (Backend.TRITON, "int4", 1e-4, 0),
         (Backend.TRITON, "int2", 1e-4, 0), (Backend.REFERENCE, "int4", 1e-5, 4), (Backend.TRITON, "int4", 1e-4, 8)]


@pytest.mark.parametrize("backend,kv_dtype,tol,sink", CASES)
def test_windowed_steps_match_dense(backend, kv_dtype, tol, sink):
    """Prefill chunks, a mixed step, decode steps across page boundaries; then a row that starts on a
    cached prefix of row 0 (its pages shared) after the mapping is lost (a new KVWindow), so its window
    and sink keys before its first new token come from a fill, at the pages' precision."""
    gen = torch.Generator().manual_seed(1)
    ps, hkv, hq, d, layers, W = 4, 2, 4, 16, 2, 6
    sm = 1 / math.sqrt(d)
    kv = KVStore(layers, 16, ps, hkv, d, kv_dtype, "cpu")
    win = KVWindow(kv, W, max_rows=3, sink=sink)
    attn = PagedAttention(kv, hq, d, sm, backend=backend, window=win)
    tables = [[9, 2, 14, 5, 1], [0, 11, 7, 3, 4], [9, 2, 6, 8, 10]]
    hist = [[{"k": torch.empty(0, hkv, d), "v": torch.empty(0, hkv, d)} for _ in range(3)] for _ in range(layers)]
    schedule = [([0, 0], [6, 3]), ([6, 3], [5, 1]), ([11, 4], [1, 1]), ([12, 5], [1, 1]), ([13, 6], [3, 1])]
    for step, item in enumerate(schedule + [None]):
        exact_from = [0, 0, 0]
        if item is None:  # row 2 on row 0's first 8 cached tokens, with a fresh window
            win = KVWindow(kv, W, max_rows=3, sink=sink)
            attn = PagedAttention(kv, hq, d, sm, backend=backend, window=win)
            rows, prev, new = [0, 1, 2], [16, 7, 8], [1, 1, 3]
            for layer in range(layers):
                for x in "kv":
                    hist[layer][2][x] = hist[layer][0][x][:8]
            exact_from = [16, 7, 8]  # everything before a row's first new token is a fill now
        else:
            rows, (prev, new) = [0, 1], item
        batch = make_batch([tables[r] for r in rows], prev, new, ps)
        attn.plan(batch)
        win.check_invariants()
        T = sum(new)
        for layer in range(layers):
            q = torch.randn(T, hq, d, generator=gen)
            k = torch.randn(T, hkv, d, generator=gen)
            v = torch.randn(T, hkv, d, generator=gen)
            out = attn.run(q, k, v, layer)
            assert out.shape == q.shape and out.dtype == q.dtype
            s = 0
            for b, n in zip(rows, new):
                h = hist[layer][b]
                h["k"], h["v"] = torch.cat([h["k"], k[s:s + n]]), torch.cat([h["v"], v[s:s + n]])
                want = _windowed_dense(q[s:s + n], h["k"], h["v"], _held(h["k"], kv_dtype), _held(h["v"], kv_dtype),
                                       exact_from[b], W, sm, sink)
                torch.testing.assert_close(out[s:s + n].double(), want, atol=tol, rtol=tol,
                                           msg=lambda m, where=f"step {step} row {b} layer {layer}": f"{where}: {m}")
                s += n
    assert win.fills > 0


def test_window_capacity_and_eviction():
    kv = KVStore(1, 64, 4, 1, 8, "int4", "cpu")
    win = KVWindow(kv, 6, max_rows=1)
    assert win.capacity == window_pages_per_row(6, 4) == 6
    assert win.total_bytes == kv_window_bytes(6, 4, 1, 1, 1, 8, 4)
    table = list(range(12))
    for pos in range(48):  # one row decoding through 12 pages: old mappings are evicted, never hot ones
        win.prepare(make_batch([table], [pos], [1], 4))
        win.check_invariants()
    assert win.evictions > 0 and win.fills == 0
    with pytest.raises(ValueError, match="window"):
        KVWindow(kv, 0, max_rows=1)
    with pytest.raises(ValueError, match="multiple of the page size"):
        KVWindow(kv, 6, max_rows=1, sink=6)


def test_sink_pages_stay_mapped():
    """A row decoding far past its sink keeps its first pages mapped (never evicted: every step reads them)
    while its window's old pages are evicted; the sink's room is in the capacity and the planner's bytes."""
    kv = KVStore(1, 64, 4, 1, 8, "int4", "cpu")
    win = KVWindow(kv, 6, max_rows=1, sink=8)
    assert win.capacity == window_pages_per_row(6, 4, 8) == 8
    assert win.total_bytes == kv_window_bytes(6, 4, 1, 1, 1, 8, 4, sink=8)
    table = list(range(20))
    for pos in range(64):
        win.prepare(make_batch([table], [pos], [1], 4))
        win.check_invariants()
        assert 0 in win._map and (pos < 4 or 1 in win._map)
    assert win.evictions > 0 and win.fills == 0
