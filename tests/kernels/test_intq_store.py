"""store_kv into INT4 / INT2 pages: the Triton kernel (interpreter on CPU) writes the same bytes, scales and
zeros as store_kv_ref (intq.quantize_int), only into its slots, in KVStore's head-major layout too; bad
scale tensors are refused with errors naming the problem, by the kernel and the twin alike."""
import pytest
import torch
from radixkv.kernels import paged_decode, paged_prefill, store_kv
from radixkv.kernels.intq import dequantize_int, packed_dim
from radixkv.kernels.reference_attention import paged_decode_ref, paged_prefill_ref, store_kv_ref

from radixkv.engine.kv_store import head_major_int_scales, head_major_pages

P, S, HKV = 5, 4, 3


def _caches(d, bits, groups, head_major, n=4):
    shape = (P, S, HKV, packed_dim(d, bits))
    if head_major:  # KVStore's layout
        pages = [head_major_pages(shape, torch.uint8, "cpu").fill_(0xA5) for _ in range(n)]
        scales = [head_major_int_scales(shape, groups, "cpu").fill_(float("nan")) for _ in range(n)]
    else:
        pages = [torch.full(shape, 0xA5, dtype=torch.uint8) for _ in range(n)]
        scales = [torch.full((P, S, HKV, groups, 2), float("nan"), dtype=torch.float16) for _ in range(n)]
    return pages, scales


@pytest.mark.parametrize("bits, groups, d, src_dtype, head_major", [
    (4, 2, 32, torch.float32, True), (4, 1, 24, torch.float16, False), (2, 4, 32, torch.float16, True),
    (2, 2, 32, torch.float32, False), (2, 1, 24, torch.float32, True),
    # groups smaller than a bit-plane: int4 groups of 16 at head_dim 64 (KVStore's), of 8, of 24 (not a power of
    # two), int2 groups of 8
    (4, 4, 64, torch.float32, True), (4, 8, 64, torch.float16, False), (4, 4, 96, torch.float32, True),
    (2, 8, 64, torch.float16, True)])
def test_store_kernel_equals_twin_bit_for_bit(bits, groups, d, src_dtype, head_major):
    gen = torch.Generator().manual_seed(bits * 100 + groups * 10 + d)
    T = 7
    k = (torch.randn(T, HKV, d, generator=gen) * 3 + 1).to(src_dtype)
    v = torch.randn(T, HKV, d, generator=gen).to(src_dtype)
    k[0, 1] = 2.5  # a constant row
    v[1, 2] *= 1e-4  # tiny values: the smallest scale
    k[2, 0, 0] = 7e4 if src_dtype == torch.float32 else 6e4  # near or past float16's range
    slots = torch.randperm(P * S, generator=gen)[:T]
    pages, scales = _caches(d, bits, groups, head_major)
    store_kv(k, v, pages[0], pages[1], slots, k_scale=scales[0], v_scale=scales[1])
    store_kv_ref(k, v, pages[2], pages[3], slots, k_scale=scales[2], v_scale=scales[3])
    for i in (0, 1):
        assert torch.equal(pages[i], pages[i + 2]), "packed codes differ"
        assert torch.equal(scales[i].nan_to_num(-1.0), scales[i + 2].nan_to_num(-1.0)), "scales or zeros differ"
    written = torch.zeros(P * S, dtype=torch.bool)
    written[slots] = True
    flat_scales = scales[0].reshape(P * S, HKV, groups, 2)
    assert flat_scales[~written].isnan().all() and not flat_scales[written].isnan().any()
    assert (pages[0].reshape(P * S, -1)[~written] == 0xA5).all(), "store_kv wrote outside its slots"
    held = dequantize_int(pages[0].reshape(P * S, HKV, -1)[slots], flat_scales[slots], bits)
    assert torch.isfinite(held).all() and torch.equal(held[0, 1], torch.full((d,), 2.5))


def _int_caches(bits=4, groups=2, d=32, dtype=torch.float16):
    pages = [torch.zeros(P, S, HKV, packed_dim(d, bits), dtype=torch.uint8) for _ in range(2)]
    scales = [torch.zeros(P, S, HKV, groups, 2, dtype=dtype) for _ in range(2)]
    return pages, scales


def _store_args(**over):
    (kc, vc), (ks, vs) = _int_caches()
    args = {"k": torch.randn(2, HKV, 32), "v": torch.randn(2, HKV, 32), "k_cache": kc, "v_cache": vc,
            "slots": torch.tensor([0, 5]), "k_scale": ks, "v_scale": vs}
    args.update(over)
    return args


@pytest.mark.parametrize("store", [store_kv, store_kv_ref], ids=["triton", "reference"])
@pytest.mark.parametrize("over, match", [
    ({"k_scale": None}, "int4 cache needs k_scale float16 \\(5, 4, 3, 'G', 2\\).*NoneType"),
    ({"v_scale": torch.zeros(P, S, HKV, 2, 2)}, "int4 cache needs v_scale float16.*got torch.float32"),
    ({"k_scale": torch.zeros(P, S, HKV, 3, 2, dtype=torch.float16)}, "G in \\[1, 2, 4, 8, 16, 32\\].*\\(5, 4, 3, 3, 2\\)"),
    ({"k_scale": torch.zeros(P, S, HKV, 2, dtype=torch.float16)}, "int4 cache needs k_scale"),
    ({"v_scale": torch.zeros(P, S, HKV, 1, 2, dtype=torch.float16)}, "share shape and strides"),
    ({"k_cache": torch.zeros(P, S, HKV, 12, dtype=torch.uint8), "v_cache": torch.zeros(P, S, HKV, 12, dtype=torch.uint8)},
     "pages of 12 bytes a row do not hold rows of head_dim 32 \\(bytes a row: int4: 16, int2: 8\\)"),
])
def test_store_refuses_bad_int_scales(store, over, match):
    with pytest.raises(ValueError, match=match):
        store(**_store_args(**over))


def test_attention_refuses_bad_int_scales():
    (kc, vc), (ks, vs) = _int_caches(bits=2, groups=4)
    q = torch.randn(1, 6, 32)
    table, lens = torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, dtype=torch.int32)
    bad = torch.zeros(P, S, HKV, 4, 2, dtype=torch.bfloat16)
    for fn in (paged_decode, paged_decode_ref):
        with pytest.raises(ValueError, match="int2 cache needs k_scale float16 .*bfloat16"):
            fn(q, kc, vc, table, lens, k_scale=bad, v_scale=vs)
        with pytest.raises(ValueError, match="do not hold rows of head_dim 20 \\(bytes a row: int4: 10, int2: 5"):
            fn(q[..., :20], kc, vc, table, lens, k_scale=ks, v_scale=vs)
    one = torch.zeros(1, dtype=torch.int32)
    for fn in (paged_prefill, paged_prefill_ref):
        with pytest.raises(ValueError, match="int2 cache needs v_scale"):
            fn(q, kc, vc, table, lens, one, torch.ones(1, dtype=torch.int32), k_scale=ks, v_scale=None)
