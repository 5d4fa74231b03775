"""The reference twins (reference_attention.py) against a dense fp64 oracle (scaled_dot_product_attention on contiguous K/V)."""
import math

import pytest
import torch

from kv_fixtures import dense_attention, make_paged
from radixkv.kernels.fp8 import quantize_fp8
from radixkv.kernels.reference_attention import paged_decode_ref, paged_prefill_ref, store_kv_ref


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("group", [1, 4])
def test_prefill_ref_matches_dense(page_size, group):
    gen = torch.Generator().manual_seed(page_size * 10 + group)
    hkv, d = 2, 16
    seq_lens, q_lens = [5, 37, 18], [5, 9, 1]
    kv = make_paged(seq_lens, page_size, hkv, d, torch.float32, gen)
    q = torch.randn(sum(q_lens), hkv * group, d, generator=gen)
    q_start = torch.tensor([0, 5, 14], dtype=torch.int32)
    out = paged_prefill_ref(q, kv.k_cache, kv.v_cache, kv.page_table, kv.seq_lens, q_start,
                            torch.tensor(q_lens, dtype=torch.int32))
    for b in range(3):
        rows = slice(int(q_start[b]), int(q_start[b]) + q_lens[b])
        want = dense_attention(q[rows], kv.k_seqs[b], kv.v_seqs[b], 1 / math.sqrt(d))
        torch.testing.assert_close(out[rows].double(), want, atol=1e-5, rtol=1e-5)


def test_decode_ref_matches_dense_fp8():
    gen = torch.Generator().manual_seed(3)
    kv = make_paged([33, 7], 4, 2, 16, torch.float8_e4m3fn, gen)
    q = torch.randn(2, 4, 16, generator=gen)
    out = paged_decode_ref(q, kv.k_cache, kv.v_cache, kv.page_table, kv.seq_lens, 0.3,
                           k_scale=kv.k_scale, v_scale=kv.v_scale)
    for b in range(2):
        want = dense_attention(q[b:b + 1], kv.k_seqs[b], kv.v_seqs[b], 0.3)
        torch.testing.assert_close(out[b:b + 1].double(), want, atol=1e-5, rtol=1e-5)


def test_store_kv_ref_writes_only_its_slots():
    gen = torch.Generator().manual_seed(0)
    k_cache = torch.full((4, 2, 1, 8), float("nan"))
    v_cache = torch.full((4, 2, 1, 8), float("nan"))
    k, v = torch.randn(3, 1, 8, generator=gen), torch.randn(3, 1, 8, generator=gen)
    slots = torch.tensor([7, 0, 3])
    store_kv_ref(k, v, k_cache, v_cache, slots)
    flat_k = k_cache.view(8, 1, 8)
    torch.testing.assert_close(flat_k[slots], k, atol=0, rtol=0)
    torch.testing.assert_close(v_cache.view(8, 1, 8)[slots], v, atol=0, rtol=0)
    untouched = [i for i in range(8) if i not in (7, 0, 3)]
    assert torch.isnan(flat_k[untouched]).all()


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_quantize_fp8_saturates_and_round_trips(dtype):
    x = torch.tensor([[1000.0, -3.0, 0.5, 0.0], [0.0, 0.0, 0.0, 0.0]])
    q, s = quantize_fp8(x, dtype)
    assert torch.isfinite(q.float()).all()
    back = q.float() * s.unsqueeze(-1)
    tol = 0.07 if dtype == torch.float8_e4m3fn else 0.13
    assert ((back[0] - x[0]).abs() <= tol * x[0].abs().max()).all()
    assert (back[1] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_quantize_fp8_with_float16_scales(dtype):
    """Rows are quantised by the float16 value of their scale: storing it loses nothing, rows never
    clip beyond fp8_max, and tiny rows get the smallest normal float16 scale."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(64, 32, generator=gen) * torch.logspace(-6, 3, 64).unsqueeze(-1)  # amax 1e-6 .. 1e3
    q, s = quantize_fp8(x, dtype, torch.float16)
    assert torch.equal(s.half().float(), s) and (s >= 2.0**-14).all()
    q32, s32 = quantize_fp8(x, dtype)
    back, back32 = q.float() * s.unsqueeze(-1), q32.float() * s32.unsqueeze(-1)
    big = x.abs().amax(-1) > 1.0  # rows above the float16 scale floor: same error as float32 scales
    err = ((back - x).norm(dim=-1) / x.norm(dim=-1))[big]
    err32 = ((back32 - x).norm(dim=-1) / x.norm(dim=-1))[big]
    assert err.max() <= 1.1 * err32.max() and err.max() < (0.04 if dtype == torch.float8_e4m3fn else 0.08)
    assert (q.float().abs() <= float(torch.finfo(dtype).max)).all()
    huge = torch.full((1, 8), 1e9)  # beyond 65504 * fp8_max: saturates, never inf * 0
    q, s = quantize_fp8(huge, dtype, torch.float16)
    assert torch.isfinite(s).all() and (q.float() * s.unsqueeze(-1)).isfinite().all()


def test_scale_errors_are_clear():
    k_cache = torch.zeros(2, 2, 1, 8, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="scale"):
        store_kv_ref(torch.zeros(1, 1, 8), torch.zeros(1, 1, 8), k_cache, k_cache.clone(), torch.tensor([0]))
