"""nucleus.nucleus_draw (top-p / min-p by rejection, no sort) against reference.nucleus_draw_ref, in the
interpreter, and the twin's draws against the exact filtered distribution.

The kernel's logs are NumPy's here and torch's in the twin (see test_sample_kernel.py), and its sums
run in another order, so kernel and twin may differ only on a near-tie of two candidates or a mass
within rounding of top_p; the random cases here have none (exact equality asserted)."""
from __future__ import annotations

import math

import pytest
import torch
from radixkv.kernels.reference_sampling import (
    NUCLEUS_MAX_ROUNDS,
    gumbel,
    gumbel_argmax_ref,
    nucleus_draw_ref,
)

nucleus = pytest.importorskip("radixkv.kernels.nucleus")

# The interpreter runs the kernel's tl.log and subtractions in NumPy, which warns where the GPU does not:
# log(0) = -inf for a masked-out or zero-probability lane and -inf - -inf = nan in lanes the kernel then
# discards. Known and harmless: silenced for these two messages from the interpreter only.
pytestmark = [
    pytest.mark.filterwarnings(r"ignore:divide by zero encountered in log:RuntimeWarning:triton\.runtime\.interpreter"),
    pytest.mark.filterwarnings(r"ignore:invalid value encountered in subtract:RuntimeWarning:triton\.runtime\.interpreter"),
]


def _rows(S: int, seed0: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.arange(S, dtype=torch.int64) * 7919 + seed0 - 2**40,
            torch.arange(S, dtype=torch.int64) % 5 + 3)


def _kept(x: torch.Tensor, inv_t: float, top_p: float, min_p: float) -> torch.Tensor:
    """The kept set K of one row, by sorting (the definition): bool [V]."""
    p = torch.softmax(x.double() * inv_t, dim=-1)
    order = p.argsort(descending=True)
    before = p[order].cumsum(0) - p[order]
    keep_sorted = before < top_p
    keep = torch.zeros_like(p, dtype=torch.bool)
    keep[order] = keep_sorted
    return keep & (p >= min_p * p.max())


def test_kernel_equals_twin_on_random_rows():
    g = torch.Generator().manual_seed(1)
    S, V = 12, 300
    x = torch.randn(S, V, generator=g) * torch.linspace(0.5, 4.0, S)[:, None]
    x[3, 7] = float("-inf")
    x[5, 100:] = float("-inf")
    inv_t = torch.tensor([1.0, 1.25, 0.5, 2.0] * 3)
    top_p = torch.tensor([0.9, 0.5, 1.0, 0.95, 0.3, 0.99, 0.8, 1.0, 0.6, 0.75, 0.1, 0.97])
    min_p = torch.tensor([0.0, 0.0, 0.1, 0.05, 0.0, 0.0, 0.2, 0.0, 0.01, 0.0, 0.0, 0.3])
    seed, counter = _rows(S)
    rounds = torch.empty(S, dtype=torch.int32)
    got = nucleus.nucleus_draw(x, inv_t, top_p, min_p, seed, counter, rounds=rounds)
    assert torch.equal(got, nucleus_draw_ref(x, inv_t, top_p, min_p, seed, counter))
    for r in range(S):
        assert _kept(x[r], float(inv_t[r]), float(top_p[r]), float(min_p[r]))[got[r]], r
    assert (rounds >= 1).all() and (rounds <= NUCLEUS_MAX_ROUNDS).all()


def test_rejections_happen_and_still_land_in_the_kept_set():
    """A flat head and a long tail: top_p 0.5 rejects often; every draw is inside K (kernel and twin)."""
    S, V = 16, 200
    x = torch.cat([torch.full((S, 4), 3.0), torch.linspace(2.0, -2.0, V - 4).repeat(S, 1)], dim=1)
    x = x + torch.arange(V) * 1e-4  # no ties
    inv_t, top_p, min_p = torch.ones(S), torch.full((S,), 0.5), torch.zeros(S)
    seed, counter = _rows(S, 11)
    rounds = torch.empty(S, dtype=torch.int32)
    got = nucleus.nucleus_draw(x, inv_t, top_p, min_p, seed, counter, rounds=rounds)
    assert torch.equal(got, nucleus_draw_ref(x, inv_t, top_p, min_p, seed, counter))
    keep = _kept(x[0], 1.0, 0.5, 0.0)
    assert keep[got].all()
    assert (rounds > 1).any()  # the tail holds most of the mass: first draws land there


def test_unfiltered_rows_draw_what_gumbel_argmax_draws():
    g = torch.Generator().manual_seed(2)
    S, V = 6, 257
    x = torch.randn(S, V, generator=g)
    inv_t = torch.tensor([1.0, 0.7, 1.3, 2.0, 0.9, 1.1])
    seed, counter = _rows(S, 5)
    ones, zeros = torch.ones(S), torch.zeros(S)
    assert torch.equal(nucleus.nucleus_draw(x, inv_t, ones, zeros, seed, counter),
                       gumbel_argmax_ref(x, inv_t, seed, counter))


def test_edge_rows():
    S, V = 4, 40
    x = torch.zeros(S, V)
    x[0] = float("-inf")  # nothing to draw: 0, as argmax
    x[1, 9] = 50.0  # one token holds all the mass
    x[2] = torch.arange(V, dtype=torch.float32)  # top_p tiny: only the best
    seed, counter = _rows(S)
    top_p = torch.tensor([0.9, 0.9, 1e-6, 0.5])
    got = nucleus.nucleus_draw(x, torch.ones(S), top_p, torch.zeros(S), seed, counter)
    assert got[:3].tolist() == [0, 9, V - 1]
    assert torch.equal(got, nucleus_draw_ref(x, torch.ones(S), top_p, torch.zeros(S), seed, counter))


def test_twin_follows_the_filtered_distribution():
    """4000 seeds of one row: frequencies of p | K within 4 sigma."""
    p = torch.tensor([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])
    x = torch.log(p).repeat(4000, 1)
    n = x.shape[0]
    seed, counter = torch.arange(n, dtype=torch.int64), torch.zeros(n, dtype=torch.int64)
    got = nucleus_draw_ref(x, torch.ones(n), torch.full((n,), 0.85), torch.zeros(n), seed, counter)
    want = p[:4] / p[:4].sum()  # 0.4 + 0.25 + 0.15 < 0.85 <= + 0.1: four tokens kept
    counts = torch.bincount(got, minlength=6).double() / n
    assert counts[4:].sum() == 0
    for tok in range(4):
        w = float(want[tok])
        assert abs(counts[tok] - w) < 4 * math.sqrt(w * (1 - w) / n) + 1e-3, (tok, counts)


def test_round_noise_differs_by_round_and_round_zero_is_gumbels():
    seed, counter = _rows(3)
    a, b = gumbel(seed, counter, 64, 1), gumbel(seed, counter, 64, 2)
    assert torch.isfinite(a).all() and not torch.equal(a, b)


@pytest.mark.parametrize("name, bad", [("top_p", torch.ones(3, dtype=torch.float64)), ("min_p", torch.ones(2))])
def test_bad_arguments_name_the_field(name, bad):
    S, V = 3, 10
    seed, counter = _rows(S)
    args = dict(top_p=torch.ones(S), min_p=torch.zeros(S))
    args[name] = bad
    with pytest.raises(ValueError, match=name):
        nucleus.nucleus_draw(torch.zeros(S, V), torch.ones(S), args["top_p"], args["min_p"], seed, counter)
