"""paged_decode / paged_prefill over INT4 / INT2 pages (interpreter on CPU) vs reference.py, outputs poisoned
with NaN; the twins vs dense attention over the dequantised values; integer pages never take a Gluon
kernel; the attention front's Triton path stores and reads KVStore's INT pages as the reference path does.

q is fp32 or fp16, and bf16 in one case each at a loose tolerance: the INT paths convert bf16 q to float16
(exact) and compute in float16, which the interpreter gets right, but its float32 -> bf16 output cast
truncates instead of rounding to nearest (about half the values one bf16 ulp off, 3.5e-3 relative instead
of 1.7e-3); benchmarks/kernels/kernel_checks.py checks bf16 exactly on the GPU.
"""
import math
import zlib

import pytest
import torch
from kv_fixtures import dense_attention
from radixkv.kernels import paged_decode, paged_prefill
from radixkv.kernels.intq import dequantize_int, packed_dim
from radixkv.kernels.reference_attention import paged_decode_ref, paged_prefill_ref, store_kv_ref

from radixkv.engine.kv_store import head_major_int_scales, head_major_pages

TOL = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}


class IntKV:
    """Random K/V rows of `lens` tokens quantised into shuffled INT pages (KVStore's head-major layout);
    unused pages hold random bytes. k_rows/v_rows: per row the dequantised values [n, Hkv, D]."""

    def __init__(self, lens, page_size, hkv, d, bits, groups, gen):
        need = [-(-n // page_size) for n in lens]
        num_pages = sum(need) + 2
        shape = (num_pages, page_size, hkv, packed_dim(d, bits))
        self.k, self.v = (head_major_pages(shape, torch.uint8, "cpu").copy_(
            torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8)) for _ in range(2))
        self.ks, self.vs = (head_major_int_scales(shape, groups, "cpu") for _ in range(2))
        perm = torch.randperm(num_pages, generator=gen).tolist()
        self.table = torch.zeros(len(lens), max(need), dtype=torch.int32)
        self.k_rows, self.v_rows, pos = [], [], 0
        for b, n in enumerate(lens):
            pages = perm[pos:pos + need[b]]
            pos += need[b]
            self.table[b, :need[b]] = torch.tensor(pages, dtype=torch.int32)
            slots = torch.tensor([pages[i // page_size] * page_size + i % page_size for i in range(n)])
            k, v = torch.randn(n, hkv, d, generator=gen) * 2 + 0.5, torch.randn(n, hkv, d, generator=gen)
            store_kv_ref(k, v, self.k, self.v, slots, k_scale=self.ks, v_scale=self.vs)
            p, o = torch.tensor(pages)[torch.arange(n) // page_size], torch.arange(n) % page_size
            self.k_rows.append(dequantize_int(self.k[p, o], self.ks[p, o], bits))
            self.v_rows.append(dequantize_int(self.v[p, o], self.vs[p, o], bits))
        self.lens = torch.tensor(lens, dtype=torch.int32)

    def caches(self):
        return {"k_cache": self.k, "v_cache": self.v, "page_table": self.table, "seq_lens": self.lens}


def _seed(*key):
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


@pytest.mark.parametrize("bits, groups, d, page_size, group, q_dtype", [
    (4, 2, 32, 16, 4, torch.float16), (4, 1, 32, 1, 1, torch.float32), (4, 2, 64, 3, 2, torch.bfloat16),
    (2, 4, 32, 16, 1, torch.float16), (2, 2, 32, 1, 4, torch.float32), (2, 1, 24, 16, 2, torch.float16),
    # groups smaller than a bit-plane (KVStore's int4 at head_dim 64: groups of 16), of 24 values, int2's of 8
    (4, 4, 64, 16, 4, torch.float16), (4, 4, 64, 3, 1, torch.float32), (4, 4, 96, 16, 2, torch.bfloat16),
    (2, 8, 64, 1, 2, torch.float16)])
def test_decode_matches_reference(bits, groups, d, page_size, group, q_dtype):
    gen = _seed(bits, groups, d, page_size, group)
    kv = IntKV([1, 29, 14], page_size, 2, d, bits, groups, gen)
    q = torch.randn(3, 2 * group, d, generator=gen).to(q_dtype)
    ref = paged_decode_ref(q, **kv.caches(), sm_scale=0.3, k_scale=kv.ks, v_scale=kv.vs)
    for splits in (1, 3):
        out = torch.full_like(q, float("nan"))
        paged_decode(q, **kv.caches(), sm_scale=0.3, k_scale=kv.ks, v_scale=kv.vs, num_splits=splits, out=out)
        assert not out.isnan().any(), "some output rows were never written"
        torch.testing.assert_close(out.float(), ref.float(), atol=TOL[q_dtype], rtol=TOL[q_dtype])


@pytest.mark.parametrize("bits, groups, d, page_size, group, q_dtype", [
    (4, 2, 32, 16, 4, torch.float16), (4, 1, 24, 1, 1, torch.float32), (2, 4, 32, 3, 2, torch.float16),
    (2, 2, 32, 16, 1, torch.float32), (4, 2, 32, 16, 2, torch.bfloat16),
    (4, 4, 64, 16, 2, torch.float16), (4, 4, 64, 1, 1, torch.float32), (4, 4, 96, 3, 2, torch.float16),
    (2, 8, 64, 16, 1, torch.float16)])
def test_prefill_matches_reference(bits, groups, d, page_size, group, q_dtype):
    gen = _seed(bits, groups, d, page_size, group, "prefill")
    lens, q_lens = [3, 21, 9, 4], [3, 6, 1, 0]  # a whole prompt, a chunk over a prefix, a decode row, none
    kv = IntKV(lens, page_size, 2, d, bits, groups, gen)
    ql = torch.tensor(q_lens, dtype=torch.int32)
    qs = (torch.cumsum(ql, 0) - ql).to(torch.int32)
    q = torch.randn(sum(q_lens), 2 * group, d, generator=gen).to(q_dtype)
    ref = paged_prefill_ref(q, **kv.caches(), q_start=qs, q_lens=ql, sm_scale=0.3, k_scale=kv.ks, v_scale=kv.vs)
    out = torch.full_like(q, float("nan"))
    paged_prefill(q, **kv.caches(), q_start=qs, q_lens=ql, sm_scale=0.3, k_scale=kv.ks, v_scale=kv.vs, out=out)
    assert not out.isnan().any(), "some output rows were never written"
    torch.testing.assert_close(out.float(), ref.float(), atol=TOL[q_dtype], rtol=TOL[q_dtype])


@pytest.mark.parametrize("bits, groups", [(4, 2), (2, 4), (4, 8)])
def test_twins_equal_dense_attention_over_the_dequantised_values(bits, groups):
    gen = _seed(bits, groups, "oracle")
    lens, q_lens = [5, 19], [2, 4]
    kv = IntKV(lens, 4, 2, 32, bits, groups, gen)
    ql = torch.tensor(q_lens, dtype=torch.int32)
    q = torch.randn(6, 4, 32, generator=gen)
    out = paged_prefill_ref(q, **kv.caches(), q_start=torch.tensor([0, 2], dtype=torch.int32), q_lens=ql,
                            k_scale=kv.ks, v_scale=kv.vs)
    dec = paged_decode_ref(q[[1, 5]], **kv.caches(), k_scale=kv.ks, v_scale=kv.vs)
    for b, (s0, m) in enumerate(((0, 2), (2, 4))):
        want = dense_attention(q[s0:s0 + m], kv.k_rows[b], kv.v_rows[b], 1 / math.sqrt(32))
        torch.testing.assert_close(out[s0:s0 + m].double(), want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(dec[b].double(), want[-1], atol=1e-5, rtol=1e-5)


def test_integer_pages_on_cpu_never_take_a_gluon_kernel(monkeypatch):
    """INT4 pages of the shape the Gluon kernels take (head_dim 128 in two groups, KVStore's layout) with the
    rules' GPU checks patched to say yes still run the Triton INT kernels on CPU: both rules need the pages
    on a CUDA device, and decode_warps_per_sm, told the head_dim, plans the Triton split rule. INT2 pages
    never take a Gluon kernel, even where the launchers' rules are patched to say yes outright."""
    import radixkv.kernels.decode as decode_mod
    import radixkv.kernels.prefill as prefill_mod
    from radixkv.kernels import dispatch

    monkeypatch.setattr(dispatch, "_gluon_int4_gpu", lambda index: True)
    monkeypatch.setattr(dispatch, "_gluon_hopper_gpu", lambda index: True)
    gen = _seed("gluon")
    ql, qs = torch.ones(2, dtype=torch.int32), torch.arange(2, dtype=torch.int32)
    for bits, d in ((4, 128), (2, 32)):
        kv = IntKV([9, 4], 4, 2, d, bits, 2, gen)
        q = torch.randn(2, 4, d, generator=gen).to(torch.float16)
        if bits == 4:
            assert not dispatch.int4_decode_gluon(q, kv.k, kv.v, kv.ks, kv.vs, q)
            assert not dispatch.hopper_prefill_supported(q, kv.k, kv.v, q, 100, kv.ks)
            assert dispatch.decode_warps_per_sm(torch.float16, kv.k, kv.v, kv.ks, 2, d) == 0
        else:
            monkeypatch.setattr(prefill_mod, "hopper_prefill_supported", lambda *a: True)
            monkeypatch.setattr(decode_mod, "fp8_decode_gluon", lambda *a: True)
            monkeypatch.setattr(decode_mod, "int4_decode_gluon", lambda *a: True)
        want = paged_decode_ref(q, **kv.caches(), k_scale=kv.ks, v_scale=kv.vs).float()
        got = paged_prefill(q, **kv.caches(), q_start=qs, q_lens=ql, k_scale=kv.ks, v_scale=kv.vs)
        torch.testing.assert_close(got.float(), want, atol=3e-3, rtol=3e-3)
        got = paged_decode(q, **kv.caches(), k_scale=kv.ks, v_scale=kv.vs)
        torch.testing.assert_close(got.float(), want, atol=3e-3, rtol=3e-3)


@pytest.mark.parametrize("kv_dtype", ["int4", "int2"])
def test_attention_front_triton_path_equals_reference_path(kv_dtype):
    """Two KVStores of the same INT dtype, one written and read by the Triton kernels (PagedAttention's
    TRITON backend, the interpreter on CPU), one by the twins, over prefill, mixed and decode steps:
    the same bytes, scales and zeros after every step, and the same outputs up to float32 rounding."""
    from test_attention_front import make_batch

    from radixkv.engine.attention import Backend, PagedAttention
    from radixkv.engine.kv_store import KVStore

    gen = _seed(kv_dtype, "front")
    page_size, hkv, hq, d = 4, 2, 4, 16
    stores = [KVStore(1, 16, page_size, hkv, d, kv_dtype, "cpu") for _ in range(2)]
    attn = [PagedAttention(s, hq, d, 1 / math.sqrt(d), backend=be)
            for s, be in zip(stores, (Backend.TRITON, Backend.REFERENCE))]
    tables = [[9, 2, 14, 5], [0, 11, 7, 3]]
    for prev, new in [([0, 0], [6, 3]), ([6, 3], [5, 1]), ([11, 4], [1, 1])]:
        q = torch.randn(sum(new), hq, d, generator=gen)
        k, v = torch.randn(sum(new), hkv, d, generator=gen), torch.randn(sum(new), hkv, d, generator=gen)
        outs = []
        for a in attn:
            a.plan(make_batch(tables, prev, new, page_size))
            outs.append(a.run(q, k, v, 0))
        torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=1e-5)
        for name in ("k_cache", "v_cache", "k_scale", "v_scale"):
            assert torch.equal(getattr(stores[0], name)[0], getattr(stores[1], name)[0]), name
