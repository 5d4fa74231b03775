"""dequant_pages (a step's FP8 / INT4 pages widened to fp16 for the Hopper extend kernel) against its twin,
under the interpreter: bit for bit on the slots each row reads; and the twin against the pages' meaning
(gather_pages), to fp16 rounding."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixkv.kernels.dequant_pages import dequant_pages, scratch_table
from radixkv.kernels.fp8 import quantize_fp8
from radixkv.kernels.intq import quantize_int
from radixkv.kernels.reference_attention import dequant_pages_ref, gather_pages


def _pages(kind: str, P: int, S: int, hkv: int, D: int, gen: torch.Generator):
    """Random K and V pages of `kind` with their scales: (k_cache, v_cache, k_scale, v_scale)."""
    out = []
    for _ in range(2):
        x = torch.randn(P, S, hkv, D, generator=gen) * 3
        if kind == "int4":
            packed, scales = quantize_int(x, 4, 2)  # KVStore's two groups a row
            out.append((packed, scales.to(torch.float16)))
        else:
            q, s = quantize_fp8(x, getattr(torch, kind), torch.float16)
            out.append((q, s))
    (kc, ks), (vc, vs) = out
    return kc, vc, ks, vs


@pytest.mark.parametrize("kind", ["float8_e4m3fn", "float8_e5m2", "int4"])
@pytest.mark.parametrize("S,hkv", [(4, 2), (3, 1)])
def test_matches_twin_on_the_slots_read(kind: str, S: int, hkv: int) -> None:
    gen = torch.Generator().manual_seed(7)
    D, P = 32, 12
    kc, vc, ks, vs = _pages(kind, P, S, hkv, D, gen)
    table = torch.randint(0, P, (3, 5), generator=gen, dtype=torch.int32)  # 3 rows, 5 slots, ids repeat
    lens = torch.tensor([5 * S, 1, 2 * S + 1], dtype=torch.int32)  # full, one token, a partial last page
    k16, v16 = dequant_pages(kc, vc, ks, vs, table, lens, D)
    want_k, want_v = dequant_pages_ref(kc, vc, ks, vs, table, lens, D)
    assert k16.shape == (15, S, hkv, D) and k16.dtype == torch.float16
    ids = scratch_table(3, 5, torch.device("cpu"))
    for b in range(3):
        n = -(-int(lens[b]) // S)
        read = ids[b, :n].long()
        assert torch.equal(k16[read], want_k[read]) and torch.equal(v16[read], want_v[read])
        # the twin means what the pages mean: gather_pages' values, to fp16 rounding
        for got, cache, scale in ((want_k, kc, ks), (want_v, vc, vs)):
            rows = gather_pages(cache, scale, table[b], int(lens[b]), torch.float32, D)  # [n, Hkv, D]
            flat = got[read].reshape(-1, hkv, D)[:int(lens[b])].float()
            torch.testing.assert_close(flat, rows, rtol=2e-3, atol=2e-3 * rows.abs().max().item())


def test_refuses_what_it_cannot_widen() -> None:
    gen = torch.Generator().manual_seed(1)
    kc, vc, ks, vs = _pages("int4", 4, 4, 1, 32, gen)
    table, lens = torch.zeros(1, 2, dtype=torch.int32), torch.tensor([5], dtype=torch.int32)
    with pytest.raises(ValueError, match="head_dim / 2 bytes"):
        dequant_pages(kc, vc, ks, vs, table, lens, 48)
    with pytest.raises(ValueError, match="contiguous fp16"):
        dequant_pages(kc, vc, ks, vs, table, lens, 32, out=(torch.empty(1), torch.empty(1)))


def _store(kind: str, P: int, S: int, hkv: int, D: int, gen: torch.Generator):
    """A one-layer KVStore of `kind` (the engine's head-major pages and scales), every slot written by
    store_kv_ref: (k_cache, v_cache, k_scale, v_scale)."""
    from radixkv.engine.kv_store import KVStore
    from radixkv.kernels.reference_attention import store_kv_ref

    kv = KVStore(1, P, S, hkv, D, kind, "cpu")
    k_scale, v_scale = kv.scales(0)
    k, v = (torch.randn(P * S, hkv, D, generator=gen) * 2 for _ in range(2))
    store_kv_ref(k, v, kv.k_cache[0], kv.v_cache[0], torch.arange(P * S), k_scale=k_scale, v_scale=v_scale)
    return kv.k_cache[0], kv.v_cache[0], k_scale, v_scale


@pytest.mark.parametrize("kind", ["fp8_e4m3", "int4"])
@pytest.mark.parametrize("S", [1, 4])
def test_kv_store_pages_and_empty_rows(kind: str, S: int) -> None:
    """KVStore's head-major layout, page size 1, a row of no tokens (nothing of it is written)."""
    gen = torch.Generator().manual_seed(3)
    D, hkv, P = 32, 2, 24
    kc, vc, ks, vs = _store(kind, P, S, hkv, D, gen)
    table = torch.randint(0, P, (3, 6), generator=gen, dtype=torch.int32)
    lens = torch.tensor([6 * S, 0, 3 * S - (S > 1)], dtype=torch.int32)
    k16 = torch.full((18, S, hkv, D), float("nan"), dtype=torch.float16)
    v16 = k16.clone()
    dequant_pages(kc, vc, ks, vs, table, lens, D, out=(k16, v16))
    want_k, want_v = dequant_pages_ref(kc, vc, ks, vs, table, lens, D)
    for b, n in enumerate((6, 0, 3)):
        read = scratch_table(3, 6, torch.device("cpu"))[b, :n].long()
        assert torch.equal(k16[read], want_k[read]) and torch.equal(v16[read], want_v[read])
        rows = gather_pages(kc, ks, table[b], int(lens[b]), torch.float32, D)
        torch.testing.assert_close(want_k[read].reshape(-1, hkv, D)[:int(lens[b])].float(), rows,
                                   rtol=2e-3, atol=2e-3 * max(1.0, rows.abs().max().item()) if n else 0.0)
    assert torch.isnan(k16[6:12]).all()  # the empty row's slots: untouched


@pytest.fixture
def stand_in_hopper(monkeypatch) -> list:
    """prefill_launcher on a stand-in Hopper kernel (the reference over the pages it is handed): returns the
    dtypes of the pages each launch was handed."""
    import sys
    import types

    from radixkv.kernels import prefill
    from radixkv.kernels.launch import LOG2E
    from radixkv.kernels.reference_attention import paged_prefill_ref

    handed = []

    def fake_launch(q, k_cache, v_cache, page_table, seq_lens, q_start, q_lens, qk_scale, max_q_len, out,
                    k_scale=None, v_scale=None, lse=None):
        handed.append(k_cache.dtype)
        o, l = paged_prefill_ref(q, k_cache, v_cache, page_table, seq_lens, q_start, q_lens, qk_scale / LOG2E,
                                 k_scale=k_scale, v_scale=v_scale, return_lse=True)
        out.copy_(o)
        if lse is not None:
            lse.copy_(l)

    monkeypatch.setitem(sys.modules, "radixkv.kernels.prefill_hopper_gluon", types.SimpleNamespace(launch=fake_launch))
    monkeypatch.setattr(prefill, "hopper_prefill_supported", lambda *a, **k: True)
    return handed


@pytest.mark.parametrize("kind", ["fp8_e4m3", "int4"])
def test_launcher_runs_the_16bit_kernel_over_the_copies(kind: str, stand_in_hopper) -> None:
    """The extend over the widened copies equals the reference over the quantised pages, output and lse; a
    launch of mostly decode rows keeps the in-kernel widening (the pages it is handed stay the quantised ones)."""
    from radixkv.kernels import prefill
    from radixkv.kernels.reference_attention import paged_prefill_ref

    handed = stand_in_hopper
    gen = torch.Generator().manual_seed(5)
    D, hkv, hq, S, P = 32, 2, 4, 4, 64
    kc, vc, ks, vs = _store(kind, P, S, hkv, D, gen)
    table = torch.randint(0, P, (2, 60), generator=gen, dtype=torch.int32)
    # FP8 takes the copies past 128 new tokens a row (dispatch.widen_first)
    lens, q_lens = torch.tensor([230, 70], dtype=torch.int32), torch.tensor([130, 70], dtype=torch.int32)
    q_start = torch.tensor([0, 130], dtype=torch.int32)
    q = torch.randn(200, hq, D, generator=gen)
    lse = torch.empty(200, hq)
    out = prefill.paged_prefill(q, kc, vc, table, lens, q_start, q_lens, k_scale=ks, v_scale=vs, max_q_len=130,
                                lse=lse)
    want, want_lse = paged_prefill_ref(q, kc, vc, table, lens, q_start, q_lens, k_scale=ks, v_scale=vs,
                                       return_lse=True)
    assert handed == [torch.float16]
    torch.testing.assert_close(out, want, rtol=3e-3, atol=3e-3)
    torch.testing.assert_close(lse, want_lse, rtol=1e-3, atol=1e-3)
    # 20 rows, 200 new tokens: under 64 a row on average, so no copies (their contexts would be widened whole)
    table20 = torch.cat([table, table[:1].expand(18, -1)])
    lens20 = torch.cat([lens, torch.full((18,), 100, dtype=torch.int32)])
    qs20 = torch.cat([q_start, torch.full((18,), 199, dtype=torch.int32)])
    ql20 = torch.cat([q_lens, torch.zeros(18, dtype=torch.int32)])
    prefill.paged_prefill(q, kc, vc, table20, lens20, qs20, ql20, k_scale=ks, v_scale=vs, max_q_len=130)
    assert handed[-1] == kc.dtype


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_distinct_pages_lists_each_page_read_once(data) -> None:
    """page_copies.distinct_pages (in a pool of its ids' size or far larger: it counts either way): every page
    a row reads listed once, ascending; the new table reaches the same page through the list on every slot
    read; reads counts the slots read."""
    import numpy as np

    from radixkv.engine.page_copies import distinct_pages

    S, P = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 12))
    B, W = data.draw(st.integers(0, 5)), data.draw(st.integers(1, 6))
    table = np.array(data.draw(st.lists(st.lists(st.integers(0, P - 1), min_size=W, max_size=W), min_size=B,
                                        max_size=B)), dtype=np.int32).reshape(B, W)
    lens = data.draw(st.lists(st.integers(0, W * S), min_size=B, max_size=B))
    got = distinct_pages(table, lens, S, data.draw(st.sampled_from([P, 1000 * P])))  # both ways of counting
    n = [-(-s // S) for s in lens]
    read = {int(p) for b in range(B) for p in table[b, :n[b]]}
    assert got.pages.tolist() == sorted(read) and got.reads == sum(n)
    for b in range(B):
        assert got.pages[got.table[b, :n[b]]].tolist() == table[b, :n[b]].tolist()
        assert not got.table[b, n[b]:].any()


def test_distinct_pages_refuses_rows_past_their_table() -> None:
    import numpy as np

    from radixkv.engine.page_copies import distinct_pages

    with pytest.raises(ValueError, match="rows read 0..2 pages"):
        distinct_pages(np.zeros((1, 2), dtype=np.int32), [9], 4, 8)


@pytest.mark.parametrize("kind", ["fp8_e4m3", "int4"])
def test_page_list_widens_each_listed_page_whole(kind: str) -> None:
    """dequant_page_list: page pages[u] into copy u, every token of it, as the per-row form widens it."""
    from radixkv.kernels.dequant_pages import dequant_page_list

    gen = torch.Generator().manual_seed(11)
    D, hkv, S, P = 32, 2, 4, 16
    kc, vc, ks, vs = _store(kind, P, S, hkv, D, gen)
    pages = torch.tensor([3, 0, 15, 7], dtype=torch.int32)
    k16, v16 = dequant_page_list(kc, vc, ks, vs, pages, D)
    want_k, want_v = dequant_pages_ref(kc, vc, ks, vs, pages.view(-1, 1), torch.full((4,), S, dtype=torch.int32), D)
    assert k16.shape == (4, S, hkv, D) and torch.equal(k16, want_k) and torch.equal(v16, want_v)
    empty = dequant_page_list(kc, vc, ks, vs, pages[:0], D)
    assert empty[0].shape == (0, S, hkv, D)


@pytest.mark.parametrize("kind", ["fp8_e4m3", "int4"])
def test_launcher_widens_shared_pages_once_through_the_distinct_list(kind: str, stand_in_hopper) -> None:
    """With `copies` (the rows' distinct pages), short FP8 extends over a shared prefix take the copies too
    (each copy read by 3 rows), and the result is the reference's over the quantised pages; copies over the
    budget and short rows sharing nothing keep the in-kernel widening; a copies table of another shape is
    refused by name."""
    import numpy as np

    from radixkv.engine.page_copies import distinct_pages
    from radixkv.kernels import prefill
    from radixkv.kernels.dequant_pages import PageCopies
    from radixkv.kernels.reference_attention import paged_prefill_ref

    handed = stand_in_hopper
    gen = torch.Generator().manual_seed(9)
    D, hkv, hq, S, P = 32, 2, 4, 4, 80
    kc, vc, ks, vs = _store(kind, P, S, hkv, D, gen)
    shared = torch.randperm(P, generator=gen)[:20].to(torch.int32)  # a 20-page prefix, then 4 pages of each row
    own = torch.randperm(P, generator=gen)[:12].view(3, 4).to(torch.int32)
    table = torch.cat([shared.expand(3, -1), own], dim=1)  # [3, 24]
    lens, q_lens = torch.tensor([90, 85, 96], dtype=torch.int32), torch.tensor([10, 5, 16], dtype=torch.int32)
    q_start = torch.tensor([0, 10, 15], dtype=torch.int32)
    q = torch.randn(31, hq, D, generator=gen)

    def run(page_table: torch.Tensor) -> torch.Tensor:
        distinct = distinct_pages(page_table.numpy(), lens.tolist(), S, P)
        copies = PageCopies(torch.from_numpy(distinct.pages), torch.from_numpy(distinct.table), distinct.reads)
        out = prefill.paged_prefill(q, kc, vc, page_table, lens, q_start, q_lens, k_scale=ks, v_scale=vs,
                                    max_q_len=16, copies=copies)
        want = paged_prefill_ref(q, kc, vc, page_table, lens, q_start, q_lens, k_scale=ks, v_scale=vs)
        torch.testing.assert_close(out, want, rtol=3e-3, atol=3e-3)
        return copies

    copies = run(table)
    assert handed == [torch.float16] and copies.pages.numel() < copies.reads / 2
    prefill.paged_prefill(q, kc, vc, table, lens, q_start, q_lens, k_scale=ks, v_scale=vs, max_q_len=16,
                          copies=copies, widen_max_bytes=copies.pages.numel() * S * hkv * D * 4 - 1)
    assert handed[-1] == kc.dtype  # copies one byte over the budget: the tiles widen in-kernel
    apart = torch.randperm(P, generator=gen)[:72].view(3, 24).to(torch.int32)  # no page shared
    run(apart)
    assert handed[-1] == kc.dtype  # ~10 new tokens a row, nothing shared: the tiles widen in-kernel
    with pytest.raises(ValueError, match="copies.table is"):
        prefill.paged_prefill(q, kc, vc, table, lens, q_start, q_lens, k_scale=ks, v_scale=vs, max_q_len=16,
                              copies=copies._replace(table=copies.table[:2]))
