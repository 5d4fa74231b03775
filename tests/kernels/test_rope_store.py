"""rope_store_kv_ (kernels/rope_store.py) in the interpreter: bit-exact against its twin and against the two
kernels it replaces (apply_rope_ + store_kv), over token-major and head-major pages; its argument checks.
bf16 runs on the GPU only (the interpreter trap test_layer_kernels.py names); the sm_90 compile (no FMA)
is in test_layer_kernels.py."""
import zlib

import pytest
import torch

from radixkv.kernels import apply_rope_, store_kv
from radixkv.kernels.reference_layers import rope_store_kv_ref
from radixkv.kernels.rope_store import rope_store_kv_


def _gen(*key) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


def _case(dtype, hq, hkv, d, page_size, head_major, T=6, num_pages=8):
    gen = _gen(str(dtype), hq, hkv, d, page_size, head_major)
    qkv = (torch.randn(T, hq + 2 * hkv, d, generator=gen) * 2).to(dtype)
    pos = torch.randint(0, 8192, (T,), generator=gen).float()
    emb = torch.cat([pos[:, None] * (1.0 / (500000.0 ** (torch.arange(0, d, 2).float() / d)))[None, :]] * 2, -1)
    cos, sin = emb.cos().to(dtype)[:, None, :], emb.sin().to(dtype)[:, None, :]  # [T, 1, D]: model.py's
    shape = (num_pages, hkv, page_size, d) if head_major else (num_pages, page_size, hkv, d)
    caches = [torch.randn(*shape, generator=gen).to(dtype) for _ in range(2)]
    if head_major:  # KVStore's layout: [P, S, Hkv, D] views of head-major storage
        caches = [c.permute(0, 2, 1, 3) for c in caches]
    slots = torch.randperm(num_pages * page_size, generator=gen)[:T]
    return qkv, cos, sin, caches, slots


@pytest.mark.parametrize("head_major", [False, True])
@pytest.mark.parametrize("page_size", [1, 16])
# 8 heads: one block; 6 heads: a block of 8 with 2 masked; 24 heads with D/2 = 24: masked dims
@pytest.mark.parametrize("hq, hkv, d", [(4, 2, 32), (4, 1, 32), (16, 4, 48)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rope_store_equals_twin_and_the_two_kernels(dtype, hq, hkv, d, page_size, head_major):
    qkv, cos, sin, (kc, vc), slots = _case(dtype, hq, hkv, d, page_size, head_major)
    twin = [qkv.clone(), kc.clone(), vc.clone()]
    rope_store_kv_ref(twin[0], cos, sin, hq, twin[1], twin[2], slots)
    two = [qkv.clone(), kc.clone(), vc.clone()]
    rotated = apply_rope_(two[0][:, :hq + hkv].clone(), cos, sin)
    store_kv(rotated[:, hq:], two[0][:, hq + hkv:], two[1], two[2], slots)
    two[0][:, :hq] = rotated[:, :hq]

    assert rope_store_kv_(qkv, cos, sin, hq, kc, vc, slots) is qkv
    for got, want, other, name in zip((qkv, kc, vc), twin, two, ("qkv", "k_cache", "v_cache")):
        assert torch.equal(got, want), f"{name} differs from the twin"
        assert torch.equal(got, other), f"{name} differs from apply_rope_ + store_kv"


def test_rope_store_leaves_other_slots_and_qkv_kv_heads_alone():
    qkv, cos, sin, (kc, vc), slots = _case(torch.float32, 4, 2, 32, 4, False)
    before = qkv.clone(), kc.clone(), vc.clone()
    rope_store_kv_(qkv, cos, sin, 4, kc, vc, slots)
    assert torch.equal(qkv[:, 4:], before[0][:, 4:]), "qkv's k and v heads are not rewritten"
    written = torch.zeros(kc.shape[0] * kc.shape[1], dtype=torch.bool)
    written[slots] = True
    for c, b in ((kc, before[1]), (vc, before[2])):
        assert torch.equal(c.flatten(0, 1)[~written], b.flatten(0, 1)[~written])
    assert torch.equal(vc.flatten(0, 1)[slots], before[0][:, 6:]), "v copied as it was"


def test_rope_store_empty_batch():
    qkv = torch.empty(0, 8, 16)
    kc = torch.zeros(2, 4, 2, 16)
    assert rope_store_kv_(qkv, torch.empty(0, 16), torch.empty(0, 16), 4, kc, kc.clone(),
                          torch.empty(0, dtype=torch.int64)) is qkv


def _bad(**change):
    qkv, cos, sin, (kc, vc), slots = _case(torch.float32, 4, 2, 32, 4, False)
    args = dict(qkv=qkv, cos=cos, sin=sin, num_q_heads=4, k_cache=kc, v_cache=vc, slots=slots)
    args.update({k: (v(args) if callable(v) else v) for k, v in change.items()})
    return args


@pytest.mark.parametrize("change, match", [
    (dict(num_q_heads=5), "not 5 q heads"),
    (dict(k_cache=lambda a: a["k_cache"].to(torch.float8_e4m3fn)), "k_cache must be torch.float32"),
    (dict(v_cache=lambda a: a["v_cache"][:, :, :1]), r"v_cache must be \[P, S, 2, 32\]"),
    (dict(slots=lambda a: a["slots"][:3]), "slots must be"),
    (dict(slots=lambda a: a["slots"].float()), "slots must be"),
    (dict(slots=lambda a: a["slots"] + 1000), "out of range"),
    (dict(cos=lambda a: a["cos"][:2]), "cos must be"),
    (dict(qkv=lambda a: a["qkv"].double()), "dtype"),
])
def test_rope_store_rejects_bad_arguments_before_writing(change, match):
    args = _bad(**change)
    pages = args["k_cache"].clone(), args["v_cache"].clone()
    with pytest.raises(ValueError, match=match):
        rope_store_kv_(**args)
    assert torch.equal(args["k_cache"], pages[0]) and torch.equal(args["v_cache"], pages[1])
