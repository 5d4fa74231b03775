"""Triton paged_decode / paged_prefill (interpreter on CPU) vs reference.py, outputs poisoned with NaN.

fp8 pages are quantised with torch (the interpreter mis-rounds in-kernel fp8 casts); the kernels
only dequantise. bf16 is GPU-only (the interpreter computes bf16 dots wrongly), so q is fp32/fp16.
"""
import zlib

import pytest
import torch

from kv_fixtures import make_paged
from radixkv.kernels import paged_decode, paged_prefill
from radixkv.kernels.launch import KernelConfig
from radixkv.kernels.reference_attention import paged_decode_ref, paged_prefill_ref

DTYPES = {  # cache dtype -> (q dtype, tolerance)
    "fp32": (torch.float32, torch.float32, 1e-5),
    "fp16": (torch.float16, torch.float16, 2e-3),
    "fp8_e4m3": (torch.float8_e4m3fn, torch.float16, 2e-3),
    "fp8_e5m2": (torch.float8_e5m2, torch.float16, 2e-3),
}


def _close(out, ref, tol):
    assert not torch.isnan(out).any(), "some output rows were never written"
    torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)


def _check_decode(q, kv, tol, splits, sm_scale=None, config=None):
    """paged_decode into a NaN-poisoned output, for each split count, against paged_decode_ref.
    q: [B, Hq, D]; kv: a kv_fixtures.make_paged cache."""
    ref = paged_decode_ref(q, kv.k_cache, kv.v_cache, kv.page_table, kv.seq_lens, sm_scale,
                           k_scale=kv.k_scale, v_scale=kv.v_scale)
    for num_splits in splits:
        out = torch.full_like(q, float("nan"))
        paged_decode(q, kv.k_cache, kv.v_cache, kv.page_table, kv.seq_lens, sm_scale, k_scale=kv.k_scale,
                     v_scale=kv.v_scale, num_splits=num_splits, config=config, out=out)
        _close(out, ref, tol)


@pytest.mark.parametrize("page_size", [1, 16, 32])
@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("kv_dtype", ["fp32", "fp16", "fp8_e4m3"])
def test_decode_matches_reference(page_size, group, kv_dtype):
    cache_dt, q_dt, tol = DTYPES[kv_dtype]
    gen = torch.Generator().manual_seed(zlib.crc32(repr((page_size, group, kv_dtype)).encode()))
    lens = torch.randint(1, 90, (3,), generator=gen).tolist()
    kv = make_paged(lens, page_size, 2, 32, cache_dt, gen)
    q = torch.randn(3, 2 * group, 32, generator=gen).to(q_dt)
    _check_decode(q, kv, tol, (1, 4), sm_scale=0.2)


@pytest.mark.parametrize("kv_dtype", ["fp16", "fp8_e4m3"])
def test_decode_k_first_variant(kv_dtype):
    """KernelConfig.k_first computes the scores as K.q^T; same results."""
    cache_dt, q_dt, tol = DTYPES[kv_dtype]
    gen = torch.Generator().manual_seed(11)
    kv = make_paged([50, 9], 16, 2, 32, cache_dt, gen)
    q = torch.randn(2, 8, 32, generator=gen).to(q_dt)
    _check_decode(q, kv, tol, (2,), config=KernelConfig(16, 16, 1, 1, k_first=True))


def test_decode_e5m2_splits_longer_than_sequence():
    """More splits than tiles: empty splits must not disturb the merge."""
    cache_dt, q_dt, tol = DTYPES["fp8_e5m2"]
    gen = torch.Generator().manual_seed(5)
    kv = make_paged([3, 40, 17], 16, 1, 16, cache_dt, gen)
    q = torch.randn(3, 4, 16, generator=gen).to(q_dt)
    out = paged_decode(q, kv.k_cache, kv.v_cache, kv.page_table, kv.seq_lens, k_scale=kv.k_scale,
                       v_scale=kv.v_scale, num_splits=7)
    ref = paged_decode_ref(q, kv.k_cache, kv.v_cache, kv.page_table, kv.seq_lens, k_scale=kv.k_scale,
                           v_scale=kv.v_scale)
    _close(out, ref, tol)


@pytest.mark.parametrize("page_size", [1, 16, 32])
@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("kv_dtype", ["fp32", "fp16", "fp8_e4m3"])
def test_prefill_matches_reference(page_size, group, kv_dtype):
    cache_dt, q_dt, tol = DTYPES[kv_dtype]
    gen = torch.Generator().manual_seed(zlib.crc32(repr((page_size, group, kv_dtype, "p")).encode()))
    q_lens = torch.randint(1, 40, (3,), generator=gen)
    prefix = torch.randint(0, 50, (3,), generator=gen)
    q_lens[1] = 1  # a decode row mixed into the prefill batch
    prefix[0] = 0  # a fresh prompt, no cached prefix
    lens = (q_lens + prefix).tolist()
    kv = make_paged(lens, page_size, 2, 32, cache_dt, gen)
    T = int(q_lens.sum())
    q = torch.randn(T, 2 * group, 32, generator=gen).to(q_dt)
    q_start = torch.cumsum(q_lens, 0).sub(q_lens).to(torch.int32)
    q_lens = q_lens.to(torch.int32)
    out = torch.full_like(q, float("nan"))
    paged_prefill(q, kv.k_cache, kv.v_cache, kv.page_table, kv.seq_lens, q_start, q_lens,
                  k_scale=kv.k_scale, v_scale=kv.v_scale, out=out)
    ref = paged_prefill_ref(q, kv.k_cache, kv.v_cache, kv.page_table, kv.seq_lens, q_start, q_lens,
                            k_scale=kv.k_scale, v_scale=kv.v_scale)
    _close(out, ref, tol)


def test_prefill_e5m2_head_dim_not_power_of_two():
    cache_dt, q_dt, tol = DTYPES["fp8_e5m2"]
    gen = torch.Generator().manual_seed(9)
    kv = make_paged([30, 9], 4, 2, 24, cache_dt, gen)
    q = torch.randn(12, 4, 24, generator=gen).to(q_dt)
    args = (kv.page_table, kv.seq_lens, torch.tensor([0, 5], dtype=torch.int32), torch.tensor([5, 7], dtype=torch.int32))
    out = paged_prefill(q, kv.k_cache, kv.v_cache, *args, k_scale=kv.k_scale, v_scale=kv.v_scale, max_q_len=7)
    ref = paged_prefill_ref(q, kv.k_cache, kv.v_cache, *args, k_scale=kv.k_scale, v_scale=kv.v_scale)
    _close(out, ref, tol)


def test_launchers_reject_bad_input():
    gen = torch.Generator().manual_seed(0)
    kv = make_paged([5], 4, 2, 16, torch.float16, gen)
    q = torch.randn(1, 4, 16).half()
    with pytest.raises(ValueError, match="page_table"):
        paged_decode(q, kv.k_cache, kv.v_cache, kv.page_table.float(), kv.seq_lens)
    with pytest.raises(ValueError, match="seq_lens"):
        paged_decode(q, kv.k_cache, kv.v_cache, kv.page_table, torch.ones(2, dtype=torch.int32))
    with pytest.raises(ValueError, match="KV heads"):
        paged_decode(torch.randn(1, 3, 16).half(), kv.k_cache, kv.v_cache, kv.page_table, kv.seq_lens)
    with pytest.raises(ValueError, match="scale"):
        paged_decode(q, kv.k_cache, kv.v_cache, kv.page_table, kv.seq_lens, k_scale=torch.ones(3))
    with pytest.raises(ValueError, match="q_lens"):
        paged_prefill(q, kv.k_cache, kv.v_cache, kv.page_table, kv.seq_lens, torch.zeros(1, dtype=torch.int32),
                      torch.ones(1, dtype=torch.float32))
    with pytest.raises(ValueError, match="sm_scale must be positive"):
        paged_prefill(q, kv.k_cache, kv.v_cache, kv.page_table, kv.seq_lens, torch.zeros(1, dtype=torch.int32),
                      torch.ones(1, dtype=torch.int32), sm_scale=0.0)


def test_int64_index_tensors_are_accepted():
    """torch.tensor([...]) defaults to int64: launchers convert index tensors to int32 on the device."""
    gen = torch.Generator().manual_seed(4)
    kv = make_paged([21, 6], 4, 2, 16, torch.float32, gen)
    q = torch.randn(2, 4, 16, generator=gen)
    want = paged_decode(q, kv.k_cache, kv.v_cache, kv.page_table, kv.seq_lens)
    got = paged_decode(q, kv.k_cache, kv.v_cache, kv.page_table.long(), kv.seq_lens.long())
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    qp = torch.randn(5, 4, 16, generator=gen)
    args = (torch.tensor([0, 3]), torch.tensor([3, 2]))
    got = paged_prefill(qp, kv.k_cache, kv.v_cache, kv.page_table.long(), kv.seq_lens.long(), *args)
    want = paged_prefill_ref(qp, kv.k_cache, kv.v_cache, kv.page_table, kv.seq_lens, *args)
    _close(got, want, 1e-5)
