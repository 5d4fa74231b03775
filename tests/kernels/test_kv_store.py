import pytest
import torch

from radixkv.engine.kv_store import KVDtype, KVStore


def test_shapes_and_scales():
    kv = KVStore(2, 5, 4, 3, 16, "fp8_e4m3", "cpu")
    assert len(kv.k_cache) == len(kv.v_cache) == 2
    assert kv.k_cache[1].shape == (5, 4, 3, 16) and kv.k_cache[1].dtype == torch.float8_e4m3fn
    assert kv.k_scale[0].shape == (5, 4, 3) and kv.k_scale[0].dtype == torch.float16
    assert kv.k_scale[0].stride() == (12, 1, 4)  # head-major: a head's page of scales is contiguous
    plain = KVStore(1, 5, 4, 3, 16, "bf16", "cpu")
    assert plain.scales(0) == (None, None) and plain.k_cache[0].dtype == torch.bfloat16


def test_bytes_per_page_counts_scales():
    # 2 (K,V) * layers 3 * page 16 * heads 8 * D 128 * 2 bytes
    assert KVStore.bytes_per_page(16, 3, 8, 128, "bf16") == 2 * 3 * 16 * 8 * 128 * 2
    assert KVStore.bytes_per_page(16, 3, 8, 128, "fp8_e5m2") == 2 * 3 * 16 * 8 * (128 + 2)  # float16 scales
    per = KVStore.bytes_per_page(16, 3, 8, 128, "fp16")
    assert KVStore.pages_for_budget(10 * per + per - 1, 16, 3, 8, 128, "fp16") == 10
    kv = KVStore(3, 7, 16, 8, 128, KVDtype.FP8_E4M3, "cpu")
    actual = sum(t.numel() * t.element_size() for t in kv.k_cache + kv.v_cache + kv.k_scale + kv.v_scale)
    assert kv.total_bytes == actual


def test_bad_input_raises():
    with pytest.raises(ValueError, match="kv_dtype"):
        KVStore(1, 1, 1, 1, 8, "auto", "cpu")
    with pytest.raises(ValueError, match="page_size"):
        KVStore(1, 1, 0, 1, 8, "fp32", "cpu")


def test_reference_store_writes_head_major_pages_and_scales():
    """store_kv_ref fills KVStore's (non-contiguous, head-major) FP8 pages and scales like contiguous ones."""
    from radixkv.kernels.reference_attention import store_kv_ref

    kv = KVStore(1, 3, 4, 2, 8, "fp8_e4m3", "cpu")
    k, v = torch.randn(5, 2, 8), torch.randn(5, 2, 8)
    slots = torch.tensor([0, 5, 6, 11, 3])
    store_kv_ref(k, v, kv.k_cache[0], kv.v_cache[0], slots, k_scale=kv.k_scale[0], v_scale=kv.v_scale[0])
    assert kv.k_cache[0].stride() == (4 * 2 * 8, 8, 4 * 8, 1) and kv.k_scale[0].stride() == (8, 1, 4)
    caches = [torch.zeros(kv.k_cache[0].shape, dtype=kv.k_cache[0].dtype) for _ in range(2)]
    scales = [torch.ones(3, 4, 2, dtype=kv.k_scale[0].dtype) for _ in range(2)]
    store_kv_ref(k, v, caches[0], caches[1], slots, k_scale=scales[0], v_scale=scales[1])
    assert torch.equal(kv.k_scale[0], scales[0]) and torch.equal(kv.v_scale[0], scales[1])
    assert torch.equal(kv.k_cache[0].float(), caches[0].float())


def test_int_stores_allocate_packed_pages_and_group_scales():
    """INT4 / INT2: uint8 pages of D * bits / 8 bytes a row, float16 (scale, zero) pairs per group
    (plan.kv_int_groups), head-major; total_bytes (plan.py's formula) is what the tensors hold."""
    for kv_dtype, width, groups in (("int4", 64, 2), ("int2", 32, 4)):
        kv = KVStore(3, 7, 16, 8, 128, kv_dtype, "cpu")
        assert kv.kv_dtype is KVDtype(kv_dtype) and kv.kv_dtype.is_int
        assert kv.k_cache[0].shape == (7, 16, 8, width) and kv.k_cache[0].dtype == torch.uint8
        assert kv.k_cache[0].stride() == (16 * 8 * width, width, 16 * width, 1)  # head-major
        ks, vs = kv.scales(2)
        assert ks.shape == vs.shape == (7, 16, 8, groups, 2) and ks.dtype == torch.float16
        assert ks.stride() == (16 * 8 * groups * 2, groups * 2, 16 * groups * 2, 2, 1)
        assert (ks[..., 0] == 1).all() and (ks[..., 1] == 0).all()
        actual = sum(t.numel() * t.element_size() for t in kv.k_cache + kv.v_cache + kv.k_scale + kv.v_scale)
        assert kv.total_bytes == actual
    # at D = 128, 72 (int4) and 48 (int2) bytes a token-head against bf16's 256
    assert KVStore.bytes_per_page(16, 3, 8, 128, "int4") == 2 * 3 * 16 * 8 * 72
    assert KVStore.bytes_per_page(16, 3, 8, 128, "int2") == 2 * 3 * 16 * 8 * 48
    with pytest.raises(ValueError, match="int2 pages need head_dim a multiple of 4"):
        KVStore(1, 1, 1, 1, 18, "int2", "cpu")
