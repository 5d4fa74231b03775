"""decode_linear (the fused decode projection) against its twin, under the interpreter (fp16: the
interpreter's bf16 is not a verdict). The twin rounds every step like the unfused kernels; the kernel's
sums run in another order, so outputs agree to a few fp16 ulps."""
from __future__ import annotations

import pytest
import torch

from radixkv.kernels.decode_linear import decode_linear
from radixkv.kernels.reference_layers import decode_linear_ref

DT = torch.float16


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got.float(), want.float(), rtol=8e-3, atol=8e-3)


def _inputs(m: int, n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(DT)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(DT)
    return x, w


@pytest.mark.parametrize("m,n,k", [(1, 48, 64), (5, 40, 96), (16, 32, 32)])
def test_store(m: int, n: int, k: int) -> None:
    x, w = _inputs(m, n, k)
    _close(decode_linear(x, w), decode_linear_ref(x, w))


@pytest.mark.parametrize("m", [1, 3])
def test_norm_then_residual(m: int) -> None:
    """x normalised first (RMSNorm prologue), the product added into the residual stream in place."""
    h, w = _inputs(m, 64, 96, seed=1)
    ln = (1 + 0.1 * torch.randn(96, generator=torch.Generator().manual_seed(2))).to(DT)
    res = torch.randn(m, 64, generator=torch.Generator().manual_seed(3)).to(DT)
    got, want = res.clone(), res.clone()
    decode_linear(h, w, "residual", out=got, norm=(ln, 1e-5))
    decode_linear_ref(h, w, "residual", out=want, norm=(ln, 1e-5))
    _close(got, want)


def test_silu_mul() -> None:
    x, w = _inputs(4, 2 * 48, 64, seed=4)
    got = decode_linear(x, w, "silu_mul")
    assert got.shape == (4, 48)
    _close(got, decode_linear_ref(x, w, "silu_mul"))


def _rope_case(m: int, hq: int, hkv: int, d: int, seed: int = 5):
    x, w = _inputs(m, (hq + 2 * hkv) * d, 64, seed=seed)
    pos = torch.arange(m) * 7 + 3
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    emb = torch.cat([pos[:, None] * inv] * 2, dim=-1)
    return x, w, emb.cos().to(DT)[:, None, :], emb.sin().to(DT)[:, None, :]


@pytest.mark.parametrize("m,hq,hkv,d", [(1, 4, 2, 32), (3, 2, 1, 64)])
def test_rope_without_store(m: int, hq: int, hkv: int, d: int) -> None:
    x, w, cos, sin = _rope_case(m, hq, hkv, d)
    kw = dict(rope=(cos, sin), heads=(hq, hkv, d))
    _close(decode_linear(x, w, "rope", **kw), decode_linear_ref(x, w, "rope", **kw))


@pytest.mark.parametrize("page_size", [1, 4])
def test_rope_stores_kv_into_pages(page_size: int) -> None:
    """k, v land in their slots (k rotated); q in out; other slots and out's k/v columns untouched."""
    m, hq, hkv, d = 3, 4, 2, 32
    x, w, cos, sin = _rope_case(m, hq, hkv, d, seed=6)
    slots = torch.tensor([5, 0, 9], dtype=torch.int64)
    caches = [torch.full((12 // page_size, page_size, hkv, d), 7.0, dtype=DT) for _ in range(4)]
    outs = [torch.zeros(m, (hq + 2 * hkv) * d, dtype=DT) for _ in range(2)]
    norm = (torch.ones(64, dtype=DT), 1e-6)
    for fn, o, (kc, vc) in ((decode_linear, outs[0], caches[:2]), (decode_linear_ref, outs[1], caches[2:])):
        fn(x, w, "rope", out=o, norm=norm, rope=(cos, sin), heads=(hq, hkv, d), kv=(kc, vc, slots[:m]))
    _close(outs[0][:, :hq * d], outs[1][:, :hq * d])
    assert outs[0][:, hq * d:].eq(0).all()
    for got, want in zip(caches[:2], caches[2:]):
        _close(got, want)
        assert got.flatten(0, 1)[[i for i in range(12) if i not in (0, 5, 9)]].eq(7).all()


@pytest.mark.parametrize("block_m,split_k", [(16, 1), (64, 1), (64, 3), (16, 2)])
def test_tall_decode_batches(block_m: int, split_k: int) -> None:
    """17-64 rows: one tile of 64 rows (the GPU's tall tile) or several of 16, every epilogue against the twin;
    K split into shares whose last one sums the partials and runs the epilogue (the counters end at 0)."""
    from radixkv.kernels.decode_linear_tiles import SplitScratch
    from radixkv.kernels.launch import KernelConfig

    scratch = SplitScratch(torch.device("cpu"), split_k * 40 * 128, 16)
    cfg = dict(config=KernelConfig(block_m=block_m, block_n=16, num_warps=4, num_stages=1), block_k=16,
               split_k=split_k, scratch=scratch)
    m, hq, hkv, d = 40, 2, 1, 32
    x, w, cos, sin = _rope_case(m, hq, hkv, d, seed=11)
    ln = (1 + 0.1 * torch.randn(64, generator=torch.Generator().manual_seed(12))).to(DT)
    slots = torch.randperm(48, generator=torch.Generator().manual_seed(13))[:m]
    caches = [torch.zeros(12, 4, hkv, d, dtype=DT) for _ in range(4)]
    outs = [torch.zeros(m, (hq + 2 * hkv) * d, dtype=DT) for _ in range(2)]
    kw = dict(norm=(ln, 1e-5), rope=(cos, sin), heads=(hq, hkv, d))
    decode_linear(x, w, "rope", out=outs[0], kv=(*caches[:2], slots), **kw, **cfg)
    decode_linear_ref(x, w, "rope", out=outs[1], kv=(*caches[2:], slots), **kw)
    _close(outs[0][:, :hq * d], outs[1][:, :hq * d])
    for got, want in zip(caches[:2], caches[2:]):
        _close(got, want)
    _close(decode_linear(x, w[:96], "silu_mul", norm=(ln, 1e-5), **cfg),
           decode_linear_ref(x, w[:96], "silu_mul", norm=(ln, 1e-5)))
    h = torch.randn(m, 48, generator=torch.Generator().manual_seed(14)).to(DT)
    got, want = h.clone(), h.clone()
    ssq = torch.empty(m, 3)
    decode_linear(x, w[:48], "residual", out=got, ssq_out=ssq, **cfg)
    decode_linear_ref(x, w[:48], "residual", out=want)
    _close(got, want)
    torch.testing.assert_close(ssq.sum(1), got.float().pow(2).sum(1), rtol=1e-5, atol=1e-5)
    assert scratch.counters.eq(0).all()
    if split_k > 1:
        with pytest.raises(ValueError, match="scratch holds"):
            decode_linear(x, w, "silu_mul", **dict(cfg, scratch=SplitScratch(x.device, 8, 1)))


@pytest.mark.parametrize("k,split_k", [(100, 3), (80, 5)])
def test_store_split_over_k_with_a_short_last_share(k: int, split_k: int) -> None:
    """K = 100 in 3 shares of 48 (the last holds 4) or 80 in 5 of 16: every K counted once."""
    from radixkv.kernels.decode_linear_tiles import SplitScratch
    from radixkv.kernels.launch import KernelConfig

    x, w = _inputs(24, 40, k, seed=15)
    scratch = SplitScratch(torch.device("cpu"), split_k * 24 * 40, 8)
    got = decode_linear(x, w, config=KernelConfig(block_m=64, block_n=16, num_warps=4, num_stages=1), block_k=16,
                        split_k=split_k, scratch=scratch)
    _close(got, decode_linear_ref(x, w))
    assert scratch.counters.eq(0).all()


def test_errors_name_the_problem() -> None:
    x, w = _inputs(2, 16, 32)
    with pytest.raises(ValueError, match="rows > 64"):
        decode_linear(torch.zeros(65, 32, dtype=DT), w)
    with pytest.raises(ValueError, match="residual"):
        decode_linear(x, w, "residual")
    with pytest.raises(ValueError, match=r"w must be \[N, 32\]"):
        decode_linear(x, torch.zeros(16, 8, dtype=DT))
    with pytest.raises(ValueError, match="heads"):
        decode_linear(x, w, "rope")
    with pytest.raises(ValueError, match="not supported"):
        decode_linear(x.float(), w.float())
    with pytest.raises(ValueError, match="epilogue"):
        decode_linear(x, w, "gelu")  # type: ignore[arg-type]


def test_residual_leaves_sums_of_squares_for_the_next_norm() -> None:
    """ssq_out holds the new h's sums of squares by column tile; a norm from them equals a norm from h."""
    from radixkv.kernels.decode_linear_tiles import partials

    m = 3
    x, w = _inputs(m, 64, 48, seed=7)
    h = torch.randn(m, 64, generator=torch.Generator().manual_seed(8)).to(DT)
    ssq = torch.full((m, partials(64, x.device)), float("nan"))
    h_ref, ssq_ref = h.clone(), torch.empty_like(ssq)
    decode_linear(x, w, "residual", out=h, ssq_out=ssq)
    torch.testing.assert_close(ssq.sum(1), h.float().pow(2).sum(1), rtol=1e-5, atol=1e-5)
    decode_linear_ref(x, w, "residual", out=h_ref, ssq_out=ssq_ref)
    _close(h, h_ref)
    torch.testing.assert_close(ssq, ssq_ref, rtol=2e-2, atol=2e-2)
    w2 = _inputs(m, 32, 64, seed=9)[1]
    ln = torch.rand(64, generator=torch.Generator().manual_seed(10)).to(DT) + 0.5
    _close(decode_linear(h, w2, norm=(ln, 1e-5), ssq=ssq), decode_linear(h, w2, norm=(ln, 1e-5)))
    _close(decode_linear(h, w2, norm=(ln, 1e-5), ssq=ssq), decode_linear_ref(h, w2, norm=(ln, 1e-5)))
