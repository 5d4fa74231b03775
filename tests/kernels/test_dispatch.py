"""kernels/dispatch.py: which kernel runs and with how many splits (no kernel runs, no GPU needed)."""
import pytest
import torch

from radixkv.kernels import dispatch
from radixkv.kernels.dispatch import (
    HOPPER_PREFILL_ENV,
    HOPPER_PREFILL_MIN_NEW,
    choose_num_splits,
    extend_dequant_enabled,
    hopper_prefill_enabled,
    hopper_prefill_supported,
    widen_first,
)


@pytest.fixture
def fresh_switches(monkeypatch):
    """Environment switches are read once per process: forget the reading before and after a test
    (after: monkeypatch then restores the environment, and the next reader sees that)."""
    hopper_prefill_enabled.cache_clear()
    extend_dequant_enabled.cache_clear()
    yield monkeypatch
    hopper_prefill_enabled.cache_clear()
    extend_dequant_enabled.cache_clear()


def test_split_choice():
    assert choose_num_splits(1, 8, 32768, 132) == 66  # one long sequence: about four programs per SM
    assert choose_num_splits(16, 8, 4096, 132) == 4
    assert choose_num_splits(256, 8, 4096, 132) == 1  # many rows fill the GPU already
    assert choose_num_splits(1, 8, 100, 132) == 1  # too short to split
    assert choose_num_splits(1, 8, 640, 132) == 10  # a short row still splits: 64 tokens a split
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


class _OnGpu:
    """A tensor (CPU or meta) that reports a CUDA device: the INT4 layout rule reads only its device,
    dtype, shape, strides and data_ptr (and views of it), so no GPU is needed to exercise the rule."""

    device = torch.device("cuda", 0)

    def __init__(self, t: torch.Tensor):
        self._t = t

    def __getattr__(self, name):
        return getattr(self._t, name)


def _int_pages(head_dim: int, kv_dtype: str, pages: int = 4, page_size: int = 16, hkv: int = 2,
               groups: int | None = None, device: str = "cpu"):
    """KVStore's head-major INT pages and (scale, zero) pairs, as CUDA stand-ins: (k, v, k_scale, v_scale)."""
    from radixkv.engine.kv_store import head_major_int_scales, head_major_pages
    from radixkv.kernels.intq import packed_dim
    from radixkv.plan import kv_int_groups

    bits = 4 if kv_dtype == "int4" else 2
    shape = (pages, page_size, hkv, packed_dim(head_dim, bits))
    groups = groups or kv_int_groups(head_dim, kv_dtype)
    k, v = (_OnGpu(head_major_pages(shape, torch.uint8, device)) for _ in range(2))
    ks, vs = (_OnGpu(head_major_int_scales(shape, groups, device)) for _ in range(2))
    return k, v, ks, vs


def test_int4_decode_gluon_needs_a_cuda_gpu(monkeypatch):
    """On CPU the INT4 Gluon kernel is never taken, even with a capable GPU check: the device decides."""
    from radixkv.engine.kv_store import head_major_int_scales, head_major_pages

    monkeypatch.setattr(dispatch, "_gluon_int4_gpu", lambda index: True)
    shape = (4, 16, 2, 64)
    k, ks = head_major_pages(shape, torch.uint8, "cpu"), head_major_int_scales(shape, 2, "cpu")
    q = torch.empty(3, 8, 128, dtype=torch.bfloat16)
    assert not dispatch.int4_decode_gluon(q, k, k, ks, ks, q)
    assert dispatch.decode_warps_per_sm(torch.bfloat16, k, k, ks, 4, 128) == 0


def test_int4_decode_gluon_rule_with_a_capable_gpu(monkeypatch):
    """With the GPU check forced true (CPU tensors that report a CUDA device stand in for the layout), the
    INT4 Gluon kernel is taken for KVStore's INT4 pages at head_dim 128 (two groups of 64) and 64 (four of
    16) with 16-bit q; not for other group sizes (valid formats the GPU checks do not cover), INT2 pages,
    fp32 or strided q, or GQA groups over 16."""
    monkeypatch.setattr(dispatch, "_gluon_int4_gpu", lambda index: True)
    q = torch.empty(3, 8, 128, dtype=torch.bfloat16)
    k, v, ks, vs = _int_pages(128, "int4")
    assert tuple(ks.shape[3:]) == (2, 2)  # radixkv.plan.kv_int_groups: 2 groups of 64 values
    assert dispatch.int4_decode_gluon(q, k, v, ks, vs, q)
    assert dispatch.int4_decode_gluon(q.half(), k, v, ks, vs, q.half())
    assert ks.view(torch.int32).squeeze(-1).shape == ks.shape[:4]  # group_words' view exists
    assert not dispatch.int4_decode_gluon(q.float(), k, v, ks, vs, q.float())  # fp32 q: the Triton kernel
    strided = torch.empty(3, 8, 256, dtype=torch.bfloat16)[..., ::2]
    assert not dispatch.int4_decode_gluon(strided, k, v, ks, vs, q)  # q's head dim strided
    assert not dispatch.int4_decode_gluon(q, k, v, ks, vs, strided)  # out's
    wide = torch.empty(3, 34, 128, dtype=torch.bfloat16)  # a GQA group of 17
    assert not dispatch.int4_decode_gluon(wide, k, v, ks, vs, wide)
    k64, v64, ks64, vs64 = _int_pages(64, "int4", hkv=4)
    assert tuple(ks64.shape[3:]) == (4, 2)  # 4 groups of 16 values: two a bit-plane
    q64 = torch.empty(3, 12, 64, dtype=torch.float16)  # SmolLM2's GQA group of 3
    assert dispatch.int4_decode_gluon(q64, k64, v64, ks64, vs64, q64)
    for groups in (1, 4, 32):  # other valid formats at head_dim 128: 128, 32 and 4 values a group
        assert not dispatch.int4_decode_gluon(q, *_int_pages(128, "int4", groups=groups), q)
    for groups in (2, 8):
        assert not dispatch.int4_decode_gluon(q64, *_int_pages(64, "int4", hkv=4, groups=groups), q64)
    k2, v2, ks2, vs2 = _int_pages(128, "int2")  # 32 bytes a row at head_dim 128
    assert not dispatch.int4_decode_gluon(q, k2, v2, ks2, vs2, q)


def test_int4_decode_gluon_needs_word_pages_and_word_pairs(monkeypatch):
    """The kernel reads pages as int32 words and each group's (s, z) as one int32 word, a bit-plane's two
    groups of 16 (head_dim 64) as one aligned 8-byte word: pages with unaligned rows, pairs that are not
    contiguous (s, z) words, or token records off that alignment take the Triton kernel."""
    monkeypatch.setattr(dispatch, "_gluon_int4_gpu", lambda index: True)
    q = torch.empty(3, 8, 128, dtype=torch.bfloat16)
    k, v, ks, vs = _int_pages(128, "int4")
    P, S, H = ks.shape[:3]
    odd = _OnGpu(torch.zeros(P, H, S, 66, dtype=torch.uint8)[..., 1:65].transpose(1, 2))  # rows off words
    assert not dispatch.int4_decode_gluon(q, odd, odd, ks, vs, q)
    swapped = _OnGpu(torch.zeros(P, H, S, 2, 2, dtype=torch.float16).transpose(3, 4).transpose(1, 2))
    assert tuple(swapped.shape) == tuple(ks.shape) and swapped.stride(3) == 1  # (g, s/z) stored zero-major
    assert not dispatch.int4_decode_gluon(q, k, v, swapped, swapped, q)
    padded = _OnGpu(torch.zeros(P, H, S, 4, 2, dtype=torch.float16)[..., :2, :].transpose(1, 2))
    assert padded.stride()[3:] == (2, 1)  # contiguous (s, z) words, 16 bytes a token: still words
    assert dispatch.int4_decode_gluon(q, k, v, padded, padded, q)
    sparse = _OnGpu(torch.zeros(P, H, S, 2, 4, dtype=torch.float16)[..., :2].transpose(1, 2))
    assert sparse.stride()[3:] == (4, 1)  # (s, z) contiguous, groups 8 bytes apart: not group_words' view
    assert not dispatch.int4_decode_gluon(q, k, v, sparse, sparse, q)
    shifted = _OnGpu(torch.zeros(P * H * S * 4 + 1, dtype=torch.float16)[1:].view(P, H, S, 2, 2).transpose(1, 2))
    assert shifted.data_ptr() % 4 == 2  # pairs off word alignment
    assert not dispatch.int4_decode_gluon(q, k, v, shifted, shifted, q)
    q64 = torch.empty(3, 12, 64, dtype=torch.float16)
    k64, v64, ks64, vs64 = _int_pages(64, "int4", hkv=4)
    P, S, H = ks64.shape[:3]
    odd_tokens = _OnGpu(torch.zeros(P, H, S, 5, 2, dtype=torch.float16)[..., :4, :].transpose(1, 2))
    assert odd_tokens.stride(1) == 10  # tokens 20 bytes apart: a plane's two groups off 8-byte alignment
    assert not dispatch.int4_decode_gluon(q64, k64, v64, odd_tokens, odd_tokens, q64)
    shifted = _OnGpu(torch.zeros(P * H * S * 8 + 2, dtype=torch.float16)[2:].view(P, H, S, 4, 2).transpose(1, 2))
    assert shifted.data_ptr() % 8 == 4
    assert not dispatch.int4_decode_gluon(q64, k64, v64, shifted, shifted, q64)
    assert dispatch.decode_warps_per_sm(torch.float16, k64, v64, ks64, 3, 64) == 12  # 168 registers, as FP8's


def test_int4_decode_warps_per_sm_needs_head_dim(monkeypatch):
    """decode_warps_per_sm gives the INT4 kernel's residency only when told q's head_dim: INT2 pages of
    head_dim 256 in 2 groups have INT4's layout at 128 byte for byte (64-byte rows, (2, 2) pairs)."""
    monkeypatch.setattr(dispatch, "_gluon_int4_gpu", lambda index: True)
    k, v, ks, _ = _int_pages(128, "int4")
    assert dispatch.decode_warps_per_sm(torch.bfloat16, k, v, ks, 4, 128) == 12  # 168 registers
    assert dispatch.decode_warps_per_sm(torch.float16, k, v, ks, 4, head_dim=128) == 12
    assert dispatch.decode_warps_per_sm(torch.bfloat16, k, v, ks, 4) == 0  # no head_dim: not INT4 for sure
    assert dispatch.decode_warps_per_sm(torch.float32, k, v, ks, 4, 128) == 0
    assert dispatch.decode_warps_per_sm(torch.bfloat16, k, v, ks, 16, 128) == 8  # 255 registers
    assert dispatch.decode_warps_per_sm(torch.bfloat16, k, v, ks, 17, 128) == 0
    k3, v3, ks3, _ = _int_pages(128, "int4", page_size=3)
    assert dispatch.decode_warps_per_sm(torch.bfloat16, k3, v3, ks3, 4, 128) == 8  # a page id per token: 200
    big, bigv, bigs, _ = _int_pages(128, "int4", pages=(1 << 20) + 1, hkv=8, device="meta")  # 2^11 words a page
    assert dispatch.decode_warps_per_sm(torch.bfloat16, big, bigv, bigs, 4, 128) == 8  # 64-bit offsets: 200
    k2, v2, ks2, vs2 = _int_pages(256, "int2", groups=2)
    assert k2.shape == k.shape and ks2.shape == ks.shape and ks2.stride() == ks.stride()
    assert dispatch.decode_warps_per_sm(torch.bfloat16, k2, v2, ks2, 4, 256) == 0
    assert dispatch.decode_warps_per_sm(torch.bfloat16, k2, v2, ks2, 4, 128) == 12  # the layout alone can't tell
    q2 = torch.empty(3, 8, 256, dtype=torch.bfloat16)
    assert not dispatch.int4_decode_gluon(q2, k2, v2, ks2, vs2, q2)


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
    scales = torch.empty(2, 2, 16, dtype=torch.float16).transpose(1, 2)
    assert hopper_prefill_supported(gpu, fp8, fp8, q, 512, scales)  # FP8 pages are widened in the kernel
    assert not hopper_prefill_supported(gpu, fp8, fp8, q, 512, scales.float())  # ... in fp16: fp16 scales only
    assert not hopper_prefill_supported(gpu, cache.view(torch.int16), cache.view(torch.int16), q, 512)
    from radixkv.engine.kv_store import head_major_int_scales, head_major_pages

    int4 = head_major_pages((2, 16, 2, 64), torch.uint8, "cpu")  # head_dim 128 in packed bytes
    pairs = head_major_int_scales(int4.shape, 2, "cpu")
    assert hopper_prefill_supported(gpu, int4, int4, q, 512, pairs)  # INT4 pages are dequantised in the kernel
    assert not hopper_prefill_supported(gpu, int4, int4, q, 512)  # ... given their (scale, zero) pairs
    assert not hopper_prefill_supported(gpu, int4, int4, q, 512, head_major_int_scales(int4.shape, 4, "cpu"))
    int2 = head_major_pages((2, 16, 2, 32), torch.uint8, "cpu")
    assert not hopper_prefill_supported(gpu, int2, int2, q, 512, head_major_int_scales(int2.shape, 4, "cpu"))
    monkeypatch.setenv(HOPPER_PREFILL_ENV, "0")
    hopper_prefill_enabled.cache_clear()  # the switch is read once per process
    assert not hopper_prefill_supported(gpu, cache, cache, q, HOPPER_PREFILL_MIN_NEW + 1)  # the way out


def test_fused_decode_rows_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """RADIXKV_FUSED_DECODE_ROWS: unset -> the default, a power of two up to 16, 64 or 0 as given, anything
    else named."""
    from radixkv.kernels.dispatch import FUSED_DECODE_ROWS, FUSED_DECODE_ROWS_ENV, fused_decode_rows

    try:
        for value, want in (("", FUSED_DECODE_ROWS), ("0", 0), (" 8 ", 8), ("64", 64)):
            monkeypatch.setenv(FUSED_DECODE_ROWS_ENV, value)
            fused_decode_rows.cache_clear()
            assert fused_decode_rows() == want
        for bad in ("17", "10", "32", "128", "-1", "many"):
            monkeypatch.setenv(FUSED_DECODE_ROWS_ENV, bad)
            fused_decode_rows.cache_clear()
            with pytest.raises(ValueError, match=FUSED_DECODE_ROWS_ENV):
                fused_decode_rows()
    finally:
        fused_decode_rows.cache_clear()


def test_widen_first(fresh_switches):
    """Extends over INT4 pages always read dequant_pages' copies, FP8 ones past one query block of new
    tokens or where each copy is read by 2 rows (a shared prefix); RADIXKV_EXTEND_DEQUANT=0 turns all off."""
    assert widen_first(True, 65) and widen_first(False, 129) and not widen_first(False, 128)
    assert widen_first(False, 16, reuse=2.0) and not widen_first(False, 16, reuse=1.9)
    extend_dequant_enabled.cache_clear()
    fresh_switches.setenv("RADIXKV_EXTEND_DEQUANT", "0")
    assert not widen_first(True, 4096) and not widen_first(False, 4096) and not widen_first(False, 16, reuse=50)
