"""Entry-point argument checks (tracker issue 16, defect 6): out-of-range slots, page ids, lengths and
row starts raise IndexValueError naming the argument, its index and value before anything is written
(under the interpreter they used to segfault, corrupt memory or return NaN); valid edge values still
work. The Triton launchers and their reference.py twins share the checks (kernels/checks.py).

Shapes are tiny: caches of P = 4 pages x S = 2 slots, one KV head of 16 dims, fp32.
"""
import math

import pytest
import torch

from radixkv.kernels import (IndexValueError, apply_rope_, paged_decode, paged_prefill, rms_norm, silu_and_mul,
                             store_kv)
from radixkv.kernels.checks import check_page_values, check_q_rows, check_slots
from radixkv.kernels.reference_attention import paged_decode_ref, paged_prefill_ref, store_kv_ref

P, S, HKV, D = 4, 2, 1, 16
I32 = torch.int32


def _caches(seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(P, S, HKV, D, generator=gen).to(dtype) for _ in range(2)]


def _i32(*rows):
    return torch.tensor(rows, dtype=I32)


def test_index_value_error_is_both_index_and_value_error():
    assert issubclass(IndexValueError, IndexError) and issubclass(IndexValueError, ValueError)


# ----------------------------------------------------------------------------- store_kv
@pytest.mark.parametrize("store", [store_kv, store_kv_ref], ids=["triton", "reference"])
@pytest.mark.parametrize("slots, bad", [
    ([0, 3, -1], "slots\\[2\\] = -1 out of range \\[0, 8\\)"),
    ([P * S, 0, 1], "slots\\[0\\] = 8 out of range"),
    ([1, 2**32, 0], "slots\\[1\\] = 4294967296 out of range"),  # would wrap to slot 0 as int32
])
def test_store_rejects_out_of_range_slots_and_writes_nothing(store, slots, bad):
    kc, vc = _caches()
    kc0, vc0 = kc.clone(), vc.clone()
    k = torch.randn(3, HKV, D)
    with pytest.raises(IndexValueError, match=bad):
        store(k, k.clone(), kc, vc, torch.tensor(slots))
    assert torch.equal(kc, kc0) and torch.equal(vc, vc0), "a refused store wrote into the caches"


def test_store_rejects_bad_int32_slot_and_fp8_scales_stay_unwritten():
    f8 = torch.zeros(P, S, HKV, D, dtype=torch.float8_e4m3fn)
    ks, vs = torch.full((P, S, HKV), float("nan")), torch.full((P, S, HKV), float("nan"))
    with pytest.raises(IndexError, match="slots\\[1\\] = -3"):  # plain IndexError / ValueError catch it too
        store_kv(torch.randn(2, HKV, D), torch.randn(2, HKV, D), f8, f8.clone(), _i32(0, -3), k_scale=ks, v_scale=vs)
    assert ks.isnan().all() and vs.isnan().all() and (f8.float() == 0).all()


def test_store_edge_slots_work_and_padding_may_share_a_slot():
    """Slot 0 and the last slot are written; two padding rows may share a scratch slot (no -1 sentinel);
    a non-contiguous slots view is read by value."""
    kc, vc = _caches()
    kr, vr = kc.clone(), vc.clone()
    k, v = torch.randn(4, HKV, D), torch.randn(4, HKV, D)
    slots = torch.tensor([P * S - 1, 9, 0, 9, 5, 9, 5, 9])[::2]  # [7, 0, 5, 5]: view of stride 2
    store_kv(k, v, kc, vc, slots)
    store_kv_ref(k, v, kr, vr, slots)
    flat = kc.view(-1, HKV, D)
    assert torch.equal(flat[7], k[0]) and torch.equal(flat[0], k[1]) and torch.equal(vc.view(-1, HKV, D)[7], v[0])
    assert torch.equal(kc[[0, 1, 3]], kr[[0, 1, 3]]) and torch.equal(vc[[0, 1, 3]], vr[[0, 1, 3]])


@pytest.mark.parametrize("args, match", [
    (dict(k=[[0.0]]), "k must be a tensor"),
    (dict(k=torch.zeros(2, HKV, D, dtype=torch.int32)), "k dtype"),
    (dict(k_cache=torch.zeros(P, S, HKV, D, dtype=torch.float64)), "k_cache dtype"),
    (dict(slots=[0, 1]), "slots must be int64"),
    (dict(slots=torch.tensor([0.0, 1.0])), "slots must be int64"),
])
def test_store_rejects_bad_types(args, match):
    kc, vc = _caches()
    full = dict(k=torch.randn(2, HKV, D), v=torch.randn(2, HKV, D), k_cache=kc, v_cache=vc, slots=torch.tensor([0, 1]))
    full.update(args)
    if "k_cache" in args:
        full["v_cache"] = args["k_cache"].clone()
    with pytest.raises(ValueError, match=match):
        store_kv(**full)


# ----------------------------------------------------------------------------- paged_decode
def _decode_both(q, kc, vc, table, lens, **kw):
    """Run paged_decode into a NaN-poisoned out; return (out, reference)."""
    out = torch.full_like(q, float("nan"))
    paged_decode(q, kc, vc, table, lens, out=out, **kw)
    return out, paged_decode_ref(q, kc, vc, table, lens)


@pytest.mark.parametrize("table, lens, bad", [
    ([[0, 1], [2, 3]], [3, 0], "seq_lens\\[1\\] = 0 out of range \\[1, 4\\]"),  # decode: the new token is in the cache
    ([[0, 1], [2, 3]], [5, 1], "seq_lens\\[0\\] = 5 out of range \\[1, 4\\]"),  # past the table's 2 pages x 2
    ([[0, 1], [2, 3]], [-2, 1], "seq_lens\\[0\\] = -2"),
    ([[0, 1], [2, 3]], [1, 2**32 + 1], "seq_lens\\[1\\] = 4294967297"),  # int64 that would wrap to 1
    ([[0, 1], [2, P]], [2, 3], "page_table\\[1, 1\\] = 4 out of range \\[0, 4\\) .*seq_lens\\[1\\] = 3"),
    ([[0, -1], [2, 3]], [4, 3], "page_table\\[0, 1\\] = -1 out of range"),
    ([[0, 1], [2**31 + 2, 3]], [4, 1], "page_table\\[1, 0\\] = 2147483650"),  # int64 that would wrap to 2
])
def test_decode_rejects_bad_values_and_writes_nothing(table, lens, bad):
    kc, vc = _caches()
    kc0 = kc.clone()
    q = torch.randn(2, 2, D)
    out = torch.full_like(q, float("nan"))
    for fn in (lambda: paged_decode(q, kc, vc, torch.tensor(table), torch.tensor(lens), num_splits=2, out=out),
               lambda: paged_decode_ref(q, kc, vc, torch.tensor(table), torch.tensor(lens))):
        with pytest.raises(IndexValueError, match=bad):
            fn()
    assert out.isnan().all() and torch.equal(kc, kc0)


def test_decode_edge_values_work():
    """The last page, a full table row (seq_len = max_pages * page_size), seq_len 1, and unused table
    entries holding garbage (never read) are all fine; the kernel equals the reference."""
    kc, vc = _caches(1)
    q = torch.randn(3, 2, D)
    table = _i32([P - 1, 0], [2, -7], [1, 10**6])  # rows 1 and 2 use one page: their second entry is unused
    lens = _i32(2 * S, 1, S)
    for splits in (1, 2):
        out, ref = _decode_both(q, kc, vc, table, lens, num_splits=splits)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kw, match", [
    (dict(num_splits=0), "num_splits must be >= 1"),
    (dict(num_splits=2.0), "num_splits must be a host int"),
    (dict(sm_scale=float("nan")), "sm_scale must be finite"),
    (dict(out=torch.zeros(2, 2, D, dtype=torch.float16)), "paged_decode: out must match q"),
])
def test_decode_rejects_bad_host_arguments(kw, match):
    kc, vc = _caches()
    with pytest.raises(ValueError, match=match):
        paged_decode(torch.randn(2, 2, D), kc, vc, _i32([0], [1]), _i32(1, 2), **kw)


def test_decode_rejects_bad_types():
    kc, vc = _caches()
    q, table, lens = torch.randn(1, 2, D), _i32([0]), _i32(1)
    with pytest.raises(ValueError, match="k_cache dtype"):
        paged_decode(q, kc.double(), vc.double(), table, lens)
    with pytest.raises(ValueError, match="q must be a tensor"):
        paged_decode(q.tolist(), kc, vc, table, lens)
    with pytest.raises(ValueError, match="page_table must be an integer tensor"):
        paged_decode(q, kc, vc, [[0]], lens)
    with pytest.raises(ValueError, match="0 slots"):
        paged_decode(q, kc[:, :0], vc[:, :0], table, lens)


# ----------------------------------------------------------------------------- paged_prefill
# Two requests over a 7-row q: request 0 owns rows 0:3 (3 new of 5 tokens), request 1 rows 3:7 (4 of 4).
TABLE = [[3, 0, 1], [2, 1, 0]]
LENS, STARTS, QLENS = [5, 4], [0, 3], [3, 4]


def _prefill_args(**over):
    args = dict(table=TABLE, lens=LENS, starts=STARTS, qlens=QLENS)
    args.update(over)
    return [torch.tensor(args[k]) for k in ("table", "lens", "starts", "qlens")]


@pytest.mark.parametrize("over, bad", [
    (dict(qlens=[6, 4]), "q_lens\\[0\\] = 6 out of range \\[0, seq_lens\\[0\\] = 5\\]"),
    (dict(qlens=[3, -1]), "q_lens\\[1\\] = -1"),
    (dict(starts=[-1, 3]), "q_start\\[0\\] = -1 with q_lens\\[0\\] = 3: rows outside q's 7 rows"),
    (dict(starts=[0, 4]), "q_start\\[1\\] = 4 with q_lens\\[1\\] = 4: rows outside"),
    (dict(starts=[0, 2**32 + 3]), "q_start\\[1\\] = 4294967299"),  # int64 that would wrap to row 3
    (dict(starts=[0, 2]), "q rows of requests 0 \\(0:3\\) and 1 \\(2:6\\) overlap"),
    (dict(starts=[3, 0], qlens=[3, 4]), "q rows of requests 1 \\(0:4\\) and 0 \\(3:6\\) overlap"),
    (dict(lens=[7, 4]), "seq_lens\\[0\\] = 7 out of range \\[0, 6\\]"),
    (dict(table=[[3, 0, 1], [2, P, 0]]), "page_table\\[1, 1\\] = 4 out of range"),
])
def test_prefill_rejects_bad_values_and_writes_nothing(over, bad):
    kc, vc = _caches()
    kc0 = kc.clone()
    q = torch.randn(7, 2, D)
    out = torch.full_like(q, float("nan"))
    args = _prefill_args(**over)
    with pytest.raises(IndexValueError, match=bad):
        paged_prefill(q, kc, vc, *args, out=out)
    with pytest.raises(IndexValueError, match=bad):
        paged_prefill_ref(q, kc, vc, *args)
    assert out.isnan().all() and torch.equal(kc, kc0)


def test_prefill_rejects_max_q_len_below_q_lens():
    kc, vc = _caches()
    q = torch.randn(7, 2, D)
    with pytest.raises(IndexValueError, match="max_q_len = 3 is below q_lens\\[1\\] = 4"):
        paged_prefill(q, kc, vc, *_prefill_args(), max_q_len=3)
    for bad in (-1, 4.0, True):
        with pytest.raises(ValueError, match="max_q_len"):
            paged_prefill(q, kc, vc, *_prefill_args(), max_q_len=bad)
    with pytest.raises(ValueError, match="sm_scale must be positive and finite"):
        paged_prefill(q, kc, vc, *_prefill_args(), sm_scale=math.inf)


def test_prefill_edge_values_work():
    """An empty request (seq_len 0, q_len 0, q_start = T), requests whose rows are out of order but
    disjoint, a full table row (seq_len 6 = 3 pages x 2), the last page and unused garbage entries:
    the kernel equals the reference on every owned row."""
    kc, vc = _caches(2)
    table = _i32([1, 2, P - 1], [-5, 99, 7], [0, 3, 123])  # row 1 uses no page, row 2 two
    lens, starts, qlens = _i32(6, 0, 3), _i32(2, 5, 0), _i32(3, 0, 2)  # rows 2:5, none, 0:2
    q = torch.randn(5, 2, D)
    out = torch.full_like(q, float("nan"))
    paged_prefill(q, kc, vc, table, lens, starts, qlens, out=out, max_q_len=3)
    ref = paged_prefill_ref(q, kc, vc, table, lens, starts, qlens)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- no value reads off the CPU
def test_value_checks_never_read_device_values():
    """On a non-CPU device (meta here: no values at all) the value checks return without reading, so
    on CUDA they add no host sync; the values are the caller's duty there."""
    kc = torch.empty(P, S, HKV, D, device="meta")
    slots = torch.empty(3, dtype=torch.int64, device="meta")
    table = torch.empty(2, 3, dtype=I32, device="meta")
    lens = torch.empty(2, dtype=I32, device="meta")
    check_slots("t", slots, kc)
    check_page_values("t", table, lens, kc, 1)
    check_q_rows("t", 7, lens, lens, lens, 1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_launches_do_not_sync():
    """Compiled kernels on CUDA tensors: no launcher check syncs with the device (sync debug mode errors)."""
    dev = torch.device("cuda")
    kc, vc = (c.to(dev) for c in _caches())
    q = torch.randn(7, 2, D, device=dev)
    table, lens, starts, qlens = (t.to(dev) for t in _prefill_args())
    k = torch.randn(2, HKV, D, device=dev)
    slots = torch.tensor([0, 7], device=dev)
    paged_prefill(q, kc, vc, table, lens, starts, qlens, max_q_len=4)  # compile outside the check
    paged_decode(q[:2], kc, vc, table, lens, num_splits=2)
    store_kv(k, k, kc, vc, slots)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        store_kv(k, k, kc, vc, slots)
        paged_decode(q[:2], kc, vc, table, lens, num_splits=2)
        paged_prefill(q, kc, vc, table, lens, starts, qlens, max_q_len=4)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_graph_capture_of_checked_launchers():
    """store_kv + paged_decode (split) + paged_prefill captured in a CUDA graph, as the engine's decode
    graphs are: a host sync in the checks would break the capture. Replay equals the reference."""
    dev = torch.device("cuda")
    kc, vc = (c.to(dev) for c in _caches(3))
    q = torch.randn(7, 2, D, device=dev)
    table, lens, starts, qlens = (t.to(dev) for t in _prefill_args())
    k = torch.randn(2, HKV, D, device=dev)
    slots = torch.tensor([1, 6], device=dev)
    outs = [torch.empty(2, 2, D, device=dev), torch.empty_like(q)]

    def step():
        store_kv(k, k, kc, vc, slots)
        paged_decode(q[:2], kc, vc, table, lens, num_splits=2, out=outs[0])
        paged_prefill(q, kc, vc, table, lens, starts, qlens, max_q_len=4, out=outs[1])

    step()  # compile
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    outs[0].zero_()
    outs[1].zero_()
    graph.replay()
    torch.cuda.synchronize()
    cpu = [t.cpu() for t in (kc, vc, q, table, lens, starts, qlens)]
    torch.testing.assert_close(outs[0].cpu(), paged_decode_ref(cpu[2][:2], *cpu[:2], *cpu[3:5]), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(outs[1].cpu(), paged_prefill_ref(cpu[2], *cpu[:2], *cpu[3:]), atol=1e-4, rtol=1e-4)


# ----------------------------------------------------------------------------- layer kernels
def test_layer_kernels_reject_bad_host_arguments_and_write_nothing():
    x, res = torch.randn(3, 8), torch.randn(3, 8)
    res0 = res.clone()
    for eps, match in ((float("nan"), "eps must be finite"), (-1e-6, "eps must be >= 0"), ("x", "eps must be a float")):
        with pytest.raises(ValueError, match=match):
            rms_norm(x, torch.ones(8), eps, res)
    with pytest.raises(ValueError, match="weight must be a tensor"):
        rms_norm(x, [1.0] * 8, 1e-6, res)
    with pytest.raises(ValueError, match="residual must be a tensor"):
        rms_norm(x, torch.ones(8), 1e-6, res.tolist())
    assert torch.equal(res, res0)
    qk = torch.randn(3, 2, 8)
    qk0 = qk.clone()
    with pytest.raises(ValueError, match="cos must be a tensor"):
        apply_rope_(qk, [[1.0] * 8] * 3, torch.zeros(3, 8))
    assert torch.equal(qk, qk0)
    with pytest.raises(ValueError, match="out must be a tensor"):
        silu_and_mul(torch.randn(3, 8), out=[0.0])
