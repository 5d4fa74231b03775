"""The sampler's noise and the twins of its kernels, in plain PyTorch: the one home of the sampler's hash
(uniform_bits, gumbel: radixkv/engine/sampling.py imports them; sample.py's kernel computes the same bits
with uint32 arithmetic), gumbel_argmax_ref (sample.py's fused Gumbel-max draw) and nucleus_draw_ref
(nucleus.py's top-p / min-p rejection draw)."""
from __future__ import annotations

import torch
from torch import Tensor

_M32 = 0xFFFFFFFF
NUCLEUS_MAX_ROUNDS = 32  # nucleus.MAX_ROUNDS
NUCLEUS_ROUND_MIX = 0x27D4EB2F  # nucleus.ROUND_MIX
U_MAX = 1.0 - 2.0**-24  # the largest float32 below 1: where u is clamped (see gumbel)


def _mul32(h: Tensor, c: int) -> Tensor:
    """(h * c) mod 2**32 for h in [0, 2**32) held in int64, without overflowing int64."""
    lo, hi = c & 0xFFFF, c >> 16
    return (h * lo + (((h * hi) & 0xFFFF) << 16)) & _M32


def _fmix32(h: Tensor) -> Tensor:
    """MurmurHash3's finaliser: a bijection of [0, 2**32) that mixes every bit into every bit."""
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


def uniform_bits(seed: Tensor, counter: Tensor, vocab_size: int, r: int = 0) -> Tensor:
    """seed, counter: int64 [S] -> 32 hashed bits int64 [S, V], a pure function of (seed, counter, id).
    r > 0: round r of nucleus_draw, whose key is _fmix32(key ^ (r * NUCLEUS_ROUND_MIX mod 2**32))."""
    lo, hi = seed & _M32, (seed >> 32) & _M32
    key = _fmix32(lo ^ _fmix32(hi ^ _fmix32((counter & _M32) ^ 0x68E31DA4)))  # [S]
    if r:
        key = _fmix32(key ^ ((r * NUCLEUS_ROUND_MIX) & _M32))
    ids = torch.arange(vocab_size, device=seed.device, dtype=torch.int64)  # [V]
    return _fmix32(_fmix32(key[:, None] ^ _mul32(ids, 0x9E3779B9)[None, :]) ^ (key[:, None] >> 7))


def gumbel(seed: Tensor, counter: Tensor, vocab_size: int, r: int = 0) -> Tensor:
    """Standard Gumbel noise float32 [S, V] from uniform_bits: g = -log(-log(u)), u in (0, 1).

    u = ((bits >> 8) + 0.5) * 2**-24 in float32. The + 0.5 rounds (to even) for bits >> 8 >= 2**23,
    and at bits >> 8 = 2**24 - 1 up to exactly 1.0, which would make g = +inf: that token would win
    whatever its logit, and a filtered (-inf) one would give NaN, which argmax picks (about 0.8% of
    rows at a 128k vocabulary). So u is clamped to U_MAX = 1 - 2**-24: only that one value changes.
    """
    u = ((uniform_bits(seed, counter, vocab_size, r) >> 8).float() + 0.5) * (1.0 / (1 << 24))
    return -torch.log(-torch.log(u.clamp_(max=U_MAX)))


def gumbel_argmax_ref(x: Tensor, inv_temperature: Tensor, seed: Tensor, counter: Tensor) -> Tensor:
    """sample.gumbel_argmax's twin: argmax(x * inv_temperature[:, None] + gumbel(seed, counter, V), -1).

    x float32 [S, V]; inv_temperature float32 [S]; seed, counter int64 [S] -> int64 [S]. torch.argmax's
    rules: the first index of the maximum wins; a NaN is above everything (the first NaN wins); a
    row all -inf gives 0. The noise is finite, so a -inf entry never wins over a finite one.
    """
    y = x * inv_temperature[:, None] + gumbel(seed, counter, x.shape[1])
    return y.argmax(dim=-1)


def nucleus_draw_ref(x: Tensor, inv_temperature: Tensor, top_p: Tensor, min_p: Tensor, seed: Tensor,
                     counter: Tensor) -> Tensor:
    """nucleus.nucleus_draw's twin: the same rounds of Gumbel-max draws and rejections, vectorised
    over rows. x float32 [S, V]; inv_temperature, top_p, min_p float32 [S]; seed, counter int64 [S]
    -> int64 [S]."""
    S, V = x.shape
    y = x * inv_temperature[:, None]  # [S, V]
    top = y.argmax(dim=-1)
    m = y.max(dim=-1).values if V else torch.full((S,), float("-inf"))
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    z = torch.where(y == float("-inf"), 0.0, torch.exp(y - m_safe[:, None])).sum(dim=-1)
    floor = m + torch.log(min_p)
    pivot = torch.full((S,), float("-inf"), device=x.device)
    tok = torch.full((S,), -1, dtype=torch.int64, device=x.device)
    for r in range(NUCLEUS_MAX_ROUNDS):
        live = tok < 0
        if not bool(live.any()):
            break
        cand = torch.where((y >= floor[:, None]) & (y > pivot[:, None]), y + gumbel(seed, counter, V, r),
                           float("-inf"))
        t = cand.argmax(dim=-1)
        best = cand.gather(1, t[:, None]).squeeze(1)
        y_t = y.gather(1, t[:, None]).squeeze(1)
        above = torch.where(y > y_t[:, None], torch.exp(y - m_safe[:, None]), 0.0).sum(dim=-1)
        found = best > float("-inf")
        accept = found & ((top_p >= 1.0) | (above < top_p * z))
        tok = torch.where(live & accept, t, torch.where(live & ~found, top, tok))
        pivot = torch.where(live, y_t, pivot)
    return torch.where(tok >= 0, tok, top)
