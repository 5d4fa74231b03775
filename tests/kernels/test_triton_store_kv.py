"""Triton store_kv (interpreter on CPU) vs store_kv_ref, caches poisoned with NaN."""
import pytest
import torch

from radixkv.kernels import store_kv
from radixkv.kernels.fp8 import fp8_max
from radixkv.kernels.reference_attention import store_kv_ref


def _setup(dtype, page_size=4, num_pages=6, hkv=3, d=24, T=7, seed=0):
    gen = torch.Generator().manual_seed(seed)
    k = torch.randn(T, hkv, d, generator=gen) * 3
    v = torch.randn(T, hkv, d, generator=gen)
    slots = torch.randperm(num_pages * page_size, generator=gen)[:T]
    shape = (num_pages, page_size, hkv, d)
    fill = float("nan") if dtype in (torch.float32, torch.float16) else 0.0
    caches = [torch.full(shape, fill).to(dtype) for _ in range(4)]
    return k, v, slots, caches


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_store_matches_reference_exactly(dtype):
    k, v, slots, (kc, vc, kr, vr) = _setup(dtype)
    store_kv(k.to(dtype), v.to(dtype), kc, vc, slots)
    store_kv_ref(k.to(dtype), v.to(dtype), kr, vr, slots)
    assert torch.equal(kc.isnan(), kr.isnan()), "written slots differ"
    assert torch.equal(kc.nan_to_num(), kr.nan_to_num()) and torch.equal(vc.nan_to_num(), vr.nan_to_num())


@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_store_fp8_quantises_per_token_head(dtype, scale_dtype):
    k, v, slots, (kc, vc, kr, vr) = _setup(dtype, seed=1)
    k[0, 1] *= 1000  # far above the FP8 range before scaling
    v[1, 2] *= 1e-4  # below the float16 scale floor
    v[2, 0] *= 1e8  # above the float16 scale ceiling (65504 * fp8_max): saturates
    scales = [torch.full(kc.shape[:3], float("nan"), dtype=scale_dtype) for _ in range(4)]
    store_kv(k, v, kc, vc, slots, k_scale=scales[0], v_scale=scales[1])
    store_kv_ref(k, v, kr, vr, slots, k_scale=scales[2], v_scale=scales[3])
    flat = slots.long()
    for got, want, s_got, s_want in ((kc, kr, scales[0], scales[2]), (vc, vr, scales[1], scales[3])):
        torch.testing.assert_close(s_got.view(-1, 3)[flat], s_want.view(-1, 3)[flat], rtol=1e-6, atol=0)
        g, w = got.view(-1, 3, 24)[flat].float(), want.view(-1, 3, 24)[flat].float()
        assert torch.isfinite(g).all() and (g.abs() <= fp8_max(dtype)).all()
        # Known interpreter trap: an in-kernel fp8 cast that rounds up across a power of two keeps the
        # old exponent (128 comes out as 64). Everything else must equal torch's cast; the GPU
        # benchmark checks the kernel's FP8 stores exactly.
        bad = g != w
        assert bad.float().mean() < 0.1
        assert torch.equal(g[bad] * 2, w[bad]), "fp8 values differ beyond the interpreter's rounding trap"
    unwritten = torch.ones(kc.shape[0] * kc.shape[1], dtype=torch.bool)
    unwritten[flat] = False
    assert scales[0].view(-1, 3)[unwritten].isnan().all(), "store_kv wrote outside its slots"


def test_store_rejects_bad_input():
    k, v, slots, (kc, vc, _, _) = _setup(torch.float32)
    with pytest.raises(ValueError, match="slots"):
        store_kv(k, v, kc, vc, slots[:3])
    with pytest.raises(ValueError, match="scales"):
        store_kv(k, v, kc, vc, slots, k_scale=torch.ones(kc.shape[:3]))
    f8 = torch.zeros(kc.shape, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="k_scale"):
        store_kv(k, v, f8, f8.clone(), slots)
