"""paged_prefill(..., lse=) (interpreter on CPU): the log-sum-exp of every row's scores in log2 units, over float,
FP8 and INT4/INT2 pages, against plain torch; paged_prefill_ref(return_lse=True) the same; bad lse tensors raise.

The shifted launch is the one a caller uses to attend over all keys but each query's W most recent:
seq_lens - W keys, rows q_start + skip .. with skip = clamp(W - prefix, 0, q_lens), so query t (at position t)
sees keys 0 .. t - W; rows with t < W are in no range and must stay untouched. bf16 pages are read by fp32 q
here (the interpreter's bf16 dots are wrong: it stores bf16 as uint16): bf16 q over bf16 pages is GPU-only.
"""
import math
import zlib

import pytest
import torch
from kv_fixtures import make_paged
from radixkv.kernels import paged_prefill
from radixkv.kernels.launch import LOG2E
from radixkv.kernels.reference_attention import paged_prefill_ref
from test_intq_attention import IntKV

W = 5  # the window a shifted launch leaves out
# tolerances: fp16 q rounds P to fp16 before P.V (the oracle is float64), so its outputs get 5e-3
# (prefix, q_len): a prompt shorter than W, prompts longer than W with no or a short prefix (two row blocks
# at the interpreter's 16-row tiles), a chunk over a prefix longer than W, a decode row
ROWS = [(0, 3), (0, 9), (3, 20), (20, 6), (12, 1)]
SENTINEL = 123.0  # what lse holds in rows no range covers


def _seed(*key):
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


def _rows():
    """q_start, q_lens int32 [B] of ROWS packed one after another, and seq_lens as a list."""
    q_lens = torch.tensor([m for _, m in ROWS], dtype=torch.int32)
    return (torch.cumsum(q_lens, 0) - q_lens).to(torch.int32), q_lens, [p + m for p, m in ROWS]


def _shifted(seq_lens, q_start, q_lens, w):
    """The launch that leaves out each query's w most recent keys: (seq_lens', q_start', q_lens')."""
    skip = (w - (seq_lens - q_lens)).clamp(min=0).minimum(q_lens)
    seq_s = (seq_lens - w).clamp(min=0)
    return seq_s.to(torch.int32), (q_start + skip).to(torch.int32), (q_lens - skip).to(torch.int32)


def _oracle(q, k_rows, v_rows, sm_scale, w):
    """Plain torch, float64: row i of ROWS' request b (position t = prefix + i) over keys 0 .. t - w.
    -> out [T, Hq, D] (NaN in rows that see no key), lse [T, Hq] (SENTINEL there)."""
    T, hq, d = q.shape
    out = torch.full((T, hq, d), float("nan"), dtype=torch.float64)
    lse = torch.full((T, hq), SENTINEL, dtype=torch.float64)
    row = 0
    for b, (prefix, m) in enumerate(ROWS):
        group = hq // k_rows[b].shape[1]
        k = k_rows[b].double().repeat_interleave(group, dim=1)  # [N, Hq, D]
        v = v_rows[b].double().repeat_interleave(group, dim=1)
        for i in range(m):
            n = prefix + i - w + 1  # keys this query sees
            if n > 0:
                s = torch.einsum("hd,nhd->hn", q[row + i].double(), k[:n]) * sm_scale  # [Hq, n]
                out[row + i] = torch.einsum("hn,nhd->hd", torch.softmax(s, dim=-1), v[:n])
                lse[row + i] = torch.logsumexp(s, dim=-1) * LOG2E
        row += m
    return out, lse


def _check_shifted(q, caches, scales, k_rows, v_rows, tol):
    """paged_prefill's shifted launch into NaN-poisoned out and SENTINEL-filled lse (a [Hq, T] buffer's transpose:
    not contiguous) vs _oracle; its plain launch's lse vs paged_prefill_ref's."""
    q_start, q_lens, lens = _rows()
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    sm_scale = 0.3
    want_o, want_lse = _oracle(q, k_rows, v_rows, sm_scale, W)
    seq_s, start_s, lens_s = _shifted(seq_lens, q_start, q_lens, W)
    assert lens_s[0] == 0 and seq_s[0] == 0  # the prompt shorter than W: no row, no key
    out = torch.full_like(q, float("nan"))
    lse = torch.full((q.shape[1], q.shape[0]), SENTINEL).t()  # [T, Hq]
    paged_prefill(q, caches["k_cache"], caches["v_cache"], caches["page_table"], seq_s, start_s, lens_s, sm_scale,
                  *scales, out=out, lse=lse)
    seen = ~want_o[:, 0, 0].isnan()  # rows with a key
    torch.testing.assert_close(lse.double(), want_lse, atol=tol, rtol=tol)  # SENTINEL kept elsewhere
    assert out[~seen].isnan().all(), "rows in no range were written"
    torch.testing.assert_close(out[seen].double(), want_o[seen], atol=tol, rtol=tol)
    # the plain launch: every row covered, lse as the twin's
    lse = torch.full((q.shape[0], q.shape[1]), SENTINEL)
    out = paged_prefill(q, caches["k_cache"], caches["v_cache"], caches["page_table"], seq_lens, q_start, q_lens,
                        sm_scale, *scales, lse=lse)
    ref_o, ref_lse = paged_prefill_ref(q, caches["k_cache"], caches["v_cache"], caches["page_table"], seq_lens,
                                       q_start, q_lens, sm_scale, *scales, return_lse=True)
    assert ref_lse.dtype == torch.float32 and ref_lse.shape == lse.shape
    torch.testing.assert_close(lse, ref_lse, atol=tol, rtol=tol)
    torch.testing.assert_close(out.float(), ref_o.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("cache_dt, q_dt, d, page_size, tol", [
    (torch.float32, torch.float32, 32, 4, 1e-5), (torch.float16, torch.float16, 64, 16, 5e-3),
    (torch.bfloat16, torch.float32, 32, 16, 1e-5), (torch.float8_e4m3fn, torch.float16, 32, 4, 5e-3),
    (torch.float8_e5m2, torch.float16, 64, 16, 5e-3)])
def test_shifted_launch_float_and_fp8_pages(cache_dt, q_dt, d, page_size, tol):
    gen = _seed(cache_dt, q_dt, d, page_size)
    _, q_lens, lens = _rows()
    kv = make_paged(lens, page_size, 2, d, cache_dt, gen)
    q = torch.randn(int(q_lens.sum()), 4, d, generator=gen).to(q_dt)
    caches = {"k_cache": kv.k_cache, "v_cache": kv.v_cache, "page_table": kv.page_table}
    _check_shifted(q, caches, (kv.k_scale, kv.v_scale), kv.k_seqs, kv.v_seqs, tol)


@pytest.mark.parametrize("bits, groups, d, page_size, q_dt, tol", [
    (4, 2, 32, 16, torch.float16, 5e-3), (4, 4, 64, 4, torch.float32, 1e-5), (2, 4, 32, 4, torch.float16, 5e-3),
    (2, 2, 32, 16, torch.float32, 1e-5)])
def test_shifted_launch_int_pages(bits, groups, d, page_size, q_dt, tol):
    gen = _seed(bits, groups, d, page_size, q_dt)
    _, q_lens, lens = _rows()
    kv = IntKV(lens, page_size, 2, d, bits, groups, gen)
    q = torch.randn(int(q_lens.sum()), 4, d, generator=gen).to(q_dt)
    caches = {"k_cache": kv.k, "v_cache": kv.v, "page_table": kv.table}
    _check_shifted(q, caches, (kv.ks, kv.vs), kv.k_rows, kv.v_rows, tol)


def test_reference_lse_is_minus_inf_in_uncovered_rows():
    gen = _seed("ref")
    kv = make_paged([4, 6], 4, 1, 16, torch.float32, gen)
    q = torch.randn(6, 2, 16, generator=gen)
    rows = torch.tensor([0, 3], dtype=torch.int32), torch.tensor([2, 1], dtype=torch.int32)  # q_start, q_lens
    args = (kv.page_table, kv.seq_lens, *rows)
    out, lse = paged_prefill_ref(q, kv.k_cache, kv.v_cache, *args, return_lse=True)
    assert torch.equal(lse[[2, 4, 5]], torch.full((3, 2), float("-inf")))
    # row 0 (position 2 of request 0) over keys 0..2
    s = torch.einsum("hd,nhd->hn", q[0].double(), kv.k_seqs[0][:3].double().expand(-1, 2, -1)) / math.sqrt(16)
    torch.testing.assert_close(lse[0].double(), torch.logsumexp(s, -1) * LOG2E, atol=1e-5, rtol=1e-5)
    assert torch.equal(out, paged_prefill_ref(q, kv.k_cache, kv.v_cache, *args))


@pytest.mark.parametrize("bad, match", [
    (torch.zeros(3, 4), r"lse shape \(3, 4\) != \[T, Hq\] = \(3, 2\)"),
    (torch.zeros(3, 2, dtype=torch.float16), "lse must be float32, got torch.float16"),
    (torch.zeros(3, 2, device="meta"), "lse must be on q's device cpu, got meta"),
    ("lse", r"lse must be a float32 tensor \[T, Hq\], got str")])
def test_bad_lse_raises(bad, match):
    kv = make_paged([3], 4, 1, 16, torch.float32, _seed("bad"))
    q = torch.randn(3, 2, 16)
    with pytest.raises(ValueError, match=match):
        paged_prefill(q, kv.k_cache, kv.v_cache, kv.page_table, kv.seq_lens, torch.zeros(1, dtype=torch.int32),
                      torch.tensor([3], dtype=torch.int32), lse=bad)
