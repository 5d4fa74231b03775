"""kernels/dispatch.py: which kernel runs and with how many splits (no kernel runs, no GPU needed)."""
import pytest
import torch

from radixkv.kernels import dispatch
from radixkv.kernels.dispatch import (
    HOPPER_PREFILL_ENV,
    HOPPER_PREFILL_MIN_NEW,
    choose_num_splits,
    hopper_prefill_enabled,
    hopper_prefill_supported,
)


@pytest.fixture
def fresh_switches(monkeypatch):
    """Environment switches are read once per process: forget the reading before and after a test
    (after: monkeypatch then restores the environment, and the next reader sees that)."""
    hopper_prefill_enabled.cache_clear()
    yield monkeypatch
    hopper_prefill_enabled.cache_clear()


def test_split_choice():
    assert choose_num_splits(1, 8, 32768, 132) == 66  # one long sequence: about four programs per SM
    assert choose_num_splits(16, 8, 4096, 132) == 4
    assert choose_num_splits(256, 8, 4096, 132) == 1  # many rows fill the GPU already
    assert choose_num_splits(1, 8, 100, 132) == 1  # too short to split
    assert choose_num_splits(64, 8, 16384, 132) == 1
    # one-warp FP8 programs, 12 resident per SM: whole waves (512 programs x 3 = 1536 <= 1584)
    assert choose_num_splits(64, 8, 16384, 132, warps_per_sm=12) == 3
    assert choose_num_splits(16, 8, 4096, 132, warps_per_sm=12) == 12
    assert choose_num_splits(128, 8, 4096, 132, warps_per_sm=12) == 3  # 1 split: 0.65 of a wave
    assert choose_num_splits(256, 8, 4096, 132, warps_per_sm=12) == 1  # >= 15 per SM: run 8 per SM unsplit
    assert choose_num_splits(1, 8, 32768, 132, warps_per_sm=12) >= 100
    assert choose_num_splits(1, 8, 100, 132, warps_per_sm=12) == 1
    assert dispatch.fp8_wide_launch(15 * 132, 132) and not dispatch.fp8_wide_launch(15 * 132 - 1, 132)


def test_fp8_register_caps_and_residency():
    assert dispatch.max_registers(128, 4) == 168
    assert dispatch.max_registers(128, 4, wide=True) == 200
    assert dispatch.max_registers(128, 16) == 255 and dispatch.max_registers(64, 16) == 168
    assert dispatch.resident_warps_per_sm(128, 4) == 12
    assert dispatch.resident_warps_per_sm(128, 4, off64=True) == 8  # 200 registers
    assert dispatch.resident_warps_per_sm(128, 4, page_size=3) == 8  # a page id per token: 200
    assert dispatch.resident_warps_per_sm(128, 16) == 8  # 255 registers, rounded up to 256


def test_fp8_decode_kernel_needs_a_cuda_gpu():
    assert not dispatch.fp8_decode_kernel_supported(torch.device("cpu"), 128, 4)
    assert not dispatch.fp8_decode_kernel_supported(torch.device("cuda"), 256, 4)  # head_dim must be 64 or 128
    assert not dispatch.fp8_decode_kernel_supported(torch.device("cuda"), 128, 32)  # group > 16
    assert dispatch.fp8_decode_warps_per_sm(torch.device("cpu"), 128, 4) == 0
    pages = torch.empty(2, 16, 2, 128, dtype=torch.float8_e4m3fn)
    scales = torch.ones(2, 16, 2)
    q = torch.empty(3, 8, 128, dtype=torch.bfloat16)
    assert dispatch.decode_warps_per_sm(torch.bfloat16, pages, pages, scales, 4) == 0  # CPU: the Triton kernel
    assert not dispatch.fp8_decode_gluon(q, pages, pages, q)
    assert dispatch.sm_count(torch.device("cpu")) == dispatch.DEFAULT_NUM_SMS


def test_fp8_decode_gluon_rule_with_a_capable_gpu(monkeypatch):
    """With the GPU check forced true (CPU tensors stand in for the layout), the Gluon kernel is
    taken for 16-bit q over FP8 pages it can read as int32 words, and only then."""
    monkeypatch.setattr(dispatch, "fp8_decode_kernel_supported", lambda device, head_dim, group: True)
    pages = torch.empty(2, 16, 2, 128, dtype=torch.float8_e4m3fn)
    scales = torch.ones(2, 16, 2)
    q = torch.empty(3, 8, 128, dtype=torch.bfloat16)
    assert dispatch.fp8_decode_gluon(q, pages, pages, q)
    assert dispatch.decode_warps_per_sm(torch.bfloat16, pages, pages, scales, 4) == 12
    assert not dispatch.fp8_decode_gluon(q.float(), pages, pages, q.float())  # fp32 q: the Triton kernel
    assert dispatch.decode_warps_per_sm(torch.float32, pages, pages, scales, 4) == 0
    half = pages.to(torch.float16)
    assert not dispatch.fp8_decode_gluon(q, half, half, q)  # not FP8
    odd = torch.empty(2, 16, 2, 130, dtype=torch.float8_e4m3fn)[..., 1:129]  # rows off word alignment
    assert not dispatch.fp8_decode_gluon(q, odd, odd, q)
    strided_q = torch.empty(3, 8, 256, dtype=torch.bfloat16)[..., ::2]
    assert not dispatch.fp8_decode_gluon(strided_q, pages, pages, q)


def test_fp8_offsets_64_by_reach_of_kvstore_layout():
    from radixkv.engine.kv_store import head_major_pages, head_major_scales

    meta = torch.device("meta")  # layouts only, nothing allocated
    for pages, want in ((1 << 10, False), (1 << 19, False), ((1 << 19) + 1, True)):  # 2^12 words a page
        shape = (pages, 16, 8, 128)
        pages_view = head_major_pages(shape, torch.float8_e4m3fn, meta)
        assert dispatch.fp8_offsets_64(pages_view, head_major_scales(shape, meta)) is want


def test_switch_values():
    for off in ("0", "false", "OFF", " no ", "No"):
        assert not dispatch.switch_on(off)
    for on in (None, "", "1", "true", "yes", "on"):
        assert dispatch.switch_on(on)


def test_hopper_switch_is_read_once(fresh_switches):
    monkeypatch = fresh_switches
    monkeypatch.delenv(HOPPER_PREFILL_ENV, raising=False)
    assert hopper_prefill_enabled()  # on by default; "0" is the way out
    monkeypatch.setenv(HOPPER_PREFILL_ENV, "0")
    assert hopper_prefill_enabled()  # already read: a later change does not count
    hopper_prefill_enabled.cache_clear()
    assert not hopper_prefill_enabled()
    for off in ("false", "OFF", " no "):
        monkeypatch.setenv(HOPPER_PREFILL_ENV, off)
        hopper_prefill_enabled.cache_clear()
        assert not hopper_prefill_enabled()
    monkeypatch.setenv(HOPPER_PREFILL_ENV, "1")
    hopper_prefill_enabled.cache_clear()
    assert hopper_prefill_enabled()


def test_hopper_prefill_rule_on_cpu_tensors(fresh_switches):
    monkeypatch = fresh_switches
    monkeypatch.delenv(HOPPER_PREFILL_ENV, raising=False)
    q = torch.empty(4, 8, 128, dtype=torch.bfloat16)
    cache = torch.empty(2, 16, 2, 128, dtype=torch.bfloat16)
    assert not hopper_prefill_supported(q, cache, cache, q, HOPPER_PREFILL_MIN_NEW + 1)  # not a GPU
    gpu = type("FakeGpuTensor", (), {"device": torch.device("cuda", 0), "shape": q.shape, "dtype": q.dtype,
                                     "stride": q.stride, "data_ptr": lambda self: 0})()
    assert not hopper_prefill_supported(gpu, cache, cache, q, HOPPER_PREFILL_MIN_NEW)  # short: Triton tiles
    half = cache.to(torch.float16)
    assert not hopper_prefill_supported(gpu, half, half, q, 512)  # q and pages differ in dtype
    padded = torch.empty(2, 16, 2, 136, dtype=torch.bfloat16)[..., :128]  # rows 272 bytes apart
    assert not hopper_prefill_supported(gpu, padded, padded, q, 512)
    # ... and with an sm_90 GPU and a Triton new enough for Gluon, the long extend is taken.
    monkeypatch.setattr(dispatch, "_gluon_hopper_gpu", lambda index: True)
    assert hopper_prefill_supported(gpu, cache, cache, q, HOPPER_PREFILL_MIN_NEW + 1)
    assert not hopper_prefill_supported(gpu, cache, cache, q, HOPPER_PREFILL_MIN_NEW)
    fp8 = torch.empty(2, 2, 16, 128, dtype=torch.float8_e4m3fn).transpose(1, 2)  # KVStore's head-major pages
    assert hopper_prefill_supported(gpu, fp8, fp8, q, 512)  # FP8 pages are widened in the kernel
    assert not hopper_prefill_supported(gpu, cache.view(torch.int16), cache.view(torch.int16), q, 512)
    monkeypatch.setenv(HOPPER_PREFILL_ENV, "0")
    hopper_prefill_enabled.cache_clear()  # the switch is read once per process
    assert not hopper_prefill_supported(gpu, cache, cache, q, HOPPER_PREFILL_MIN_NEW + 1)  # the way out
