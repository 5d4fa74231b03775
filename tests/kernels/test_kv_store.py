import pytest
import torch

from radixkv.kv_store import KVDtype, KVStore


def test_shapes_and_scales():
    kv = KVStore(2, 5, 4, 3, 16, "fp8_e4m3", "cpu")
    assert len(kv.k_cache) == len(kv.v_cache) == 2
    assert kv.k_cache[1].shape == (5, 4, 3, 16) and kv.k_cache[1].dtype == torch.float8_e4m3fn
    assert kv.k_scale[0].shape == (5, 4, 3) and kv.k_scale[0].dtype == torch.float32
    plain = KVStore(1, 5, 4, 3, 16, "bf16", "cpu")
    assert plain.scales(0) == (None, None) and plain.k_cache[0].dtype == torch.bfloat16


def test_bytes_per_page_counts_scales():
    # 2 (K,V) * layers 3 * page 16 * heads 8 * D 128 * 2 bytes
    assert KVStore.bytes_per_page(16, 3, 8, 128, "bf16") == 2 * 3 * 16 * 8 * 128 * 2
    assert KVStore.bytes_per_page(16, 3, 8, 128, "fp8_e5m2") == 2 * 3 * 16 * 8 * (128 + 4)
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
