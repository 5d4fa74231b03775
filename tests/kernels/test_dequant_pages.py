"""dequant_pages (a step's FP8 / INT4 pages widened to fp16 for the Hopper extend kernel) against its twin,
under the interpreter: bit for bit on the slots each row reads; and the twin against the pages' meaning
(gather_pages), to fp16 rounding."""
from __future__ import annotations

import pytest
import torch

from radixkv.kernels.dequant_pages import dequant_pages, scratch_table
from radixkv.kernels.fp8 import quantize_fp8
from radixkv.kernels.intq import quantize_int
from radixkv.kernels.reference_attention import dequant_pages_ref, gather_pages


def _pages(kind: str, P: int, S: int, hkv: int, D: int, gen: torch.Generator):
    """Random K and V pages of `kind` with their scales: (k_cache, v_cache, k_scale, v_scale)."""
    out = []
    for _ in range(2):
        x = torch.randn(P, S, hkv, D, generator=gen) * 3
        if kind == "int4":
            packed, scales = quantize_int(x, 4, 2)  # KVStore's two groups a row
            out.append((packed, scales.to(torch.float16)))
        else:
            q, s = quantize_fp8(x, getattr(torch, kind), torch.float16)
            out.append((q, s))
    (kc, ks), (vc, vs) = out
    return kc, vc, ks, vs


@pytest.mark.parametrize("kind", ["float8_e4m3fn", "float8_e5m2", "int4"])
@pytest.mark.parametrize("S,hkv", [(4, 2), (3, 1)])
def test_matches_twin_on_the_slots_read(kind: str, S: int, hkv: int) -> None:
    gen = torch.Generator().manual_seed(7)
    D, P = 32, 12
    kc, vc, ks, vs = _pages(kind, P, S, hkv, D, gen)
    table = torch.randint(0, P, (3, 5), generator=gen, dtype=torch.int32)  # 3 rows, 5 slots, ids repeat
    lens = torch.tensor([5 * S, 1, 2 * S + 1], dtype=torch.int32)  # full, one token, a partial last page
    k16, v16 = dequant_pages(kc, vc, ks, vs, table, lens, D)
    want_k, want_v = dequant_pages_ref(kc, vc, ks, vs, table, lens, D)
    assert k16.shape == (15, S, hkv, D) and k16.dtype == torch.float16
    ids = scratch_table(3, 5, torch.device("cpu"))
    for b in range(3):
        n = -(-int(lens[b]) // S)
        read = ids[b, :n].long()
        assert torch.equal(k16[read], want_k[read]) and torch.equal(v16[read], want_v[read])
        # the twin means what the pages mean: gather_pages' values, to fp16 rounding
        for got, cache, scale in ((want_k, kc, ks), (want_v, vc, vs)):
            rows = gather_pages(cache, scale, table[b], int(lens[b]), torch.float32, D)  # [n, Hkv, D]
            flat = got[read].reshape(-1, hkv, D)[:int(lens[b])].float()
            torch.testing.assert_close(flat, rows, rtol=2e-3, atol=2e-3 * rows.abs().max().item())


def test_refuses_what_it_cannot_widen() -> None:
    gen = torch.Generator().manual_seed(1)
    kc, vc, ks, vs = _pages("int4", 4, 4, 1, 32, gen)
    table, lens = torch.zeros(1, 2, dtype=torch.int32), torch.tensor([5], dtype=torch.int32)
    with pytest.raises(ValueError, match="head_dim / 2 bytes"):
        dequant_pages(kc, vc, ks, vs, table, lens, 48)
    with pytest.raises(ValueError, match="contiguous fp16"):
        dequant_pages(kc, vc, ks, vs, table, lens, 32, out=(torch.empty(1), torch.empty(1)))
