"""sample.gumbel_argmax (the fused Gumbel-max draw) against reference.gumbel_argmax_ref, in the interpreter.

What is exact and what is not: the kernel's hash bits, u and x * inv_temperature are bit-identical to
the twin's (asserted). The two logs are NumPy's here and torch's in the twin; they differ in the
last bit for ~20% of inputs, and near g = 0 (u ~ 1/e, where -log(u) ~ 1) the outer log turns one
ulp of -log(u) into a large relative error of g. So the noise is compared in absolute terms, within
NOISE_ULPS ulps of max(1, |g|) (measured: at most 8, over all 2**24 values of u, NumPy 2.4 vs torch
2.13). Tokens are then checked robustly by construction:
- exactly, against torch.argmax over the kernel's OWN noise (the debug path writes it): the same
  arithmetic, so this pins the reduction (ties, NaN, -inf) bit for bit;
- against the twin: equal, except where the twin's best and the kernel's pick are within twice the
  noise tolerance (a near-tie the rounding of log may decide either way; the random cases here have
  none, which is asserted by counting).
"""
from __future__ import annotations

import importlib

import pytest
import torch

from radixkv.kernels import reference_sampling
from radixkv.kernels.reference_sampling import gumbel, gumbel_argmax_ref, uniform_bits

sample = pytest.importorskip("radixkv.kernels.sample")

NOISE_ULPS = 16
F32_EPS = 2.0**-23
INF = float("inf")
NAN = float("nan")
SEEDS = [0, 1, -1, -5, 2**31, 2**32 - 1, 2**32, 2**62 + 12345, 2**63 - 1, -2**63, -18847220, 987654321987654321]
COUNTERS = [0, 1, 7, 2**31 - 1, 2**32 + 5, 2**40 + 3, 123456]


def _rows(S: int, offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    seed = torch.tensor([SEEDS[(i + offset) % len(SEEDS)] for i in range(S)], dtype=torch.int64)
    counter = torch.tensor([COUNTERS[(3 * i + offset) % len(COUNTERS)] for i in range(S)], dtype=torch.int64)
    return seed, counter


def _noise_tol(g: torch.Tensor) -> torch.Tensor:
    return NOISE_ULPS * F32_EPS * g.abs().clamp(min=1.0)


def _check(x, inv_t, seed, counter, block_v, splits, *, near_ties_allowed: int = 0) -> torch.Tensor:
    """Run the debug path; assert bits, noise and tokens as the module docstring says. Returns tokens."""
    tok, bits, noise = sample.gumbel_argmax_debug(x, inv_t, seed, counter, block_v, splits)
    V = x.shape[1]
    assert tok.dtype == torch.int64 and tok.shape == (x.shape[0],)
    assert torch.equal(bits, uniform_bits(seed, counter, V))
    g = gumbel(seed, counter, V)
    assert ((noise - g).abs() <= _noise_tol(g)).all(), (noise - g).abs().max()
    assert torch.equal(tok, (x * inv_t[:, None] + noise).argmax(dim=-1))  # the reduction, exactly
    want = gumbel_argmax_ref(x, inv_t, seed, counter)
    assert torch.equal(tok, sample.gumbel_argmax(x, inv_t, seed, counter, splits=splits))
    differ = (tok != want).nonzero().flatten().tolist()
    if differ:
        y = x * inv_t[:, None] + g
        for r in differ:  # only a near-tie of the twin's own values may differ
            tol = 2 * _noise_tol(g[r]).max()
            assert y[r, tok[r]] >= y[r, want[r]] - tol, (r, tok[r].item(), want[r].item())
    assert len(differ) <= near_ties_allowed, differ
    return tok


@pytest.mark.parametrize("S", [1, 3, 17])
@pytest.mark.parametrize("V, block_v, splits", [(1, 64, 1), (100, 64, 1), (1000, 128, 1), (1000, 64, 3),
                                                (4099, 256, 5), (300, 16, 40)])
def test_random_logits_match_the_twin(S, V, block_v, splits):
    """V not a multiple of the tile, one to many splits (40 > tiles: clamped), negative and huge seeds."""
    gen = torch.Generator().manual_seed(S * 1000 + V)
    x = torch.randn(S, V, generator=gen) * 3
    temps = torch.tensor([0.05, 0.3, 0.7, 1.0, 1.5, 4.0, 100.0])
    inv_t = (1.0 / temps[torch.arange(S) % len(temps)]).float()
    seed, counter = _rows(S, offset=V)
    _check(x, inv_t, seed, counter, block_v, splits)


@pytest.mark.parametrize("S, V, block_v, splits", [(3, 1000, 64, 1), (17, 777, 128, 2), (1, 4096, 4096, 1)])
def test_zero_logits_pick_the_largest_uniform(S, V, block_v, splits):
    """x = 0, inv_temperature = 1: the token is the argmax of the noise, i.e. the first id of the largest
    u (g increases with u): an integer-exact check of the hash bits that needs no log."""
    x = torch.zeros(S, V)
    seed, counter = _rows(S, offset=S)
    tok = _check(x, torch.ones(S), seed, counter, block_v, splits)
    u = ((uniform_bits(seed, counter, V) >> 8).float() + 0.5) * 2.0**-24
    assert torch.equal(tok, u.clamp(max=reference_sampling.U_MAX).argmax(dim=-1))


def test_filtered_tokens_never_win():
    """-inf (filtered) entries: kept sets of 1..5 ids, a survivor far below the noise's scale, and a row
    all -inf (token 0, as torch.argmax)."""
    S, V = 17, 600
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(S, V, generator=gen)
    keep = torch.zeros(S, V, dtype=torch.bool)
    for r in range(S - 1):
        ids = torch.randperm(V, generator=gen)[: 1 + r % 5]
        keep[r, ids] = True
    x = x.masked_fill(~keep, -INF)
    x[3, keep[3]] = -1e30  # finite, far below every Gumbel value
    inv_t = torch.full((S,), 1.25)
    seed, counter = _rows(S)
    for splits in (1, 4):
        tok = _check(x, inv_t, seed, counter, 64, splits)
        assert keep[torch.arange(S - 1), tok[:-1]].all() and tok[-1] == 0
        assert tok[0] == keep[0].nonzero().item()  # a single survivor is always the draw


def test_the_top_uniform_is_clamped_below_one():
    """bits >> 8 = 2**24 - 1 would round u up to 1.0 and make g = +inf (a token winning whatever its logit,
    NaN and a filtered token drawn when it is -inf): the noise there is -log(-log(1 - 2**-24)) ~ 16.6."""
    seed, counter, hot, V = torch.tensor([-18847220, -18847220]), torch.tensor([3, 3]), 2026, 3000
    assert (uniform_bits(seed, counter, V)[0, hot] >> 8).item() == 2**24 - 1
    top = -torch.log(-torch.log(torch.tensor(reference_sampling.U_MAX)))
    assert gumbel(seed, counter, V)[0, hot] == top and torch.isfinite(gumbel(seed, counter, V)).all()
    x = torch.zeros(2, V)
    x[1] = -INF
    x[1, 5] = 0.0  # only token 5 survives in row 1
    for splits in (1, 3):
        tok = _check(x, torch.ones(2), seed, counter, 256, splits)
        assert tok.tolist() == [hot, 5]
    _, _, noise = sample.gumbel_argmax_debug(x, torch.ones(2), seed, counter, 256)
    assert torch.isfinite(noise).all() and abs(noise[0, hot].item() - top.item()) <= 1e-5


@pytest.mark.parametrize("block_v, splits", [(16, 1), (16, 3), (64, 2)])
def test_exact_ties_go_to_the_first_id(block_v, splits):
    """x = -noise (the kernel's own) makes y exactly 0 where chosen: ties across lanes, tiles and splits."""
    S, V, B = 4, 200, block_v
    seed, counter = _rows(S, offset=2)
    _, _, noise = sample.gumbel_argmax_debug(torch.zeros(S, V), torch.ones(S), seed, counter, block_v)
    x = -noise - 1.0  # y ~ -1 everywhere ...
    ties = [[2 * B + 7, 3 * B + 1, 5 * B + 7], [B + 3, 2 * B + 3], [V - 1, V - 2], [0, V - 1]]
    for r, ids in enumerate(ties):
        ids = [i % V for i in ids]
        x[r, ids] = -noise[r, ids]  # ... and exactly 0 at ids
    tok, _, _ = sample.gumbel_argmax_debug(x, torch.ones(S), seed, counter, block_v, splits)
    assert tok.tolist() == [min(i % V for i in ids) for ids in ties]
    x = -noise.clone()
    x[:, :37] = -INF  # all 0 after a -inf prefix: the first finite id
    tok, _, _ = sample.gumbel_argmax_debug(x, torch.ones(S), seed, counter, block_v, splits)
    assert tok.tolist() == [37] * S


@pytest.mark.filterwarnings("ignore:invalid value encountered in multiply")  # NumPy on -inf * 0
@pytest.mark.parametrize("splits", [1, 2, 5])
def test_nan_and_inf_follow_torch_argmax(splits):
    """+inf: the first +inf wins; NaN beats everything, +inf included, the first NaN wins; -inf with NaN:
    the NaN; all -inf: 0. As torch.argmax (the twin), whatever split holds which."""
    S, V = 7, 320
    x = torch.randn(S, V, generator=torch.Generator().manual_seed(3))
    x[0, [250, 90]] = INF
    x[1, 300] = NAN
    x[1, 3] = INF
    x[2, [270, 40]] = NAN
    x[3] = -INF
    x[4] = -INF
    x[4, 200] = NAN
    x[5, 0] = NAN
    x[6, V - 1] = INF
    seed, counter = _rows(S)
    want = [90, 300, 40, 0, 200, 0, V - 1]
    tok, _, _ = sample.gumbel_argmax_debug(x, torch.ones(S), seed, counter, 32, splits)
    assert tok.tolist() == want == gumbel_argmax_ref(x, torch.ones(S), seed, counter).tolist()
    zero_t = torch.zeros(S)  # inv_temperature 0: -inf * 0 is NaN (it wins); finite * 0 leaves the noise
    x = torch.zeros(S, V)
    x[2, 17] = -INF
    assert _check(x, zero_t, seed, counter, 32, splits)[2] == 17


def test_row_strides_views_and_empty_batches():
    S, V = 5, 333
    big = torch.randn(S, V + 40, generator=torch.Generator().manual_seed(4))
    x = big[:, 13:13 + V]  # row stride V + 40
    params = torch.randn(3, 2 * S)
    inv_t = params[1, ::2].abs() + 0.5  # strided views, as SamplingRows' packed rows might be
    seed = torch.arange(2 * S, dtype=torch.int64)[::2] * -977
    counter = torch.arange(2 * S, dtype=torch.int64)[1::2]
    _check(x, inv_t, seed, counter, 64, 2)
    assert torch.equal(sample.gumbel_argmax(x, inv_t, seed, counter), gumbel_argmax_ref(x, inv_t, seed, counter))
    empty = sample.gumbel_argmax(torch.zeros(0, V), torch.ones(0), torch.zeros(0, dtype=torch.int64),
                                 torch.zeros(0, dtype=torch.int64))
    assert empty.shape == (0,) and empty.dtype == torch.int64


@pytest.mark.parametrize("bad, word", [
    (dict(x=torch.zeros(3, 10, dtype=torch.float16)), "x must be float32"),
    (dict(x=torch.zeros(30)), "x must be float32"),
    (dict(x=torch.zeros(3, 0)), "vocabulary"),
    (dict(x=torch.zeros(10, 3).t()), "contiguous"),
    (dict(inv_temperature=torch.ones(3, dtype=torch.float64)), "inv_temperature"),
    (dict(inv_temperature=torch.ones(4)), "inv_temperature"),
    (dict(seed=torch.zeros(3, dtype=torch.int32)), "seed"),
    (dict(counter=torch.zeros(2, dtype=torch.int64)), "counter"),
    (dict(splits=0), "splits"),
])
def test_launcher_rejects_bad_arguments(bad, word):
    args = dict(x=torch.zeros(3, 10), inv_temperature=torch.ones(3), seed=torch.zeros(3, dtype=torch.int64),
                counter=torch.zeros(3, dtype=torch.int64))
    splits = bad.pop("splits", None)
    args.update(bad)
    with pytest.raises(ValueError, match=word):
        sample.gumbel_argmax(args["x"], args["inv_temperature"], args["seed"], args["counter"], splits=splits)


def test_default_splits_fill_the_gpu():
    """About PROGRAMS_PER_SM programs a multiprocessor (132 off a CUDA device), whole tiles each; one on CPU."""
    meta = torch.device("meta")
    assert sample.default_splits(64, 128256, 4096, torch.device("cpu")) == 1
    assert sample.default_splits(1, 128256, 4096, meta) == 32  # every tile its own program
    assert sample.default_splits(64, 128256, 4096, meta) == 5
    assert sample.default_splits(300, 128256, 4096, meta) == 1
    assert sample.default_splits(4, 1000, 4096, meta) == 1


def test_registered_and_the_hash_has_one_home():
    import radixkv.engine.sampling as sampling
    from radixkv import kernels

    assert "gumbel_argmax" in kernels.__all__ and "gumbel_argmax(" in kernels.__doc__
    assert kernels.gumbel_argmax is importlib.import_module("radixkv.kernels.sample").gumbel_argmax
    assert not hasattr(sampling, "uniform_bits")  # the hash lives in kernels/reference_sampling.py alone
    assert kernels.nucleus_draw is importlib.import_module("radixkv.kernels.nucleus").nucleus_draw


# ----------------------------------------------------------------------------- sm_90 compile
_SM90 = r"""
import json, re, sys
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from radixkv.kernels import sample

cfg = json.loads(sys.argv[1])
cuda = torch.device("cuda")  # options only: nothing runs
if cfg["kernel"] == "merge":
    fn, consts = sample._merge_kernel, dict(BLOCK_S=32)
    types = dict(part_v_ptr="*fp32", part_i_ptr="*i32", out_ptr="*i64", n_split="i32")
    opts = sample.launch_options(sample.KernelConfig(1, 1, 1, 1), cuda)
else:
    fn = sample._sample_kernel
    c = sample.GPU_CONFIG
    consts = dict(BLOCK_V=c.block_n, PARTIAL=cfg["partial"], DEBUG=False, LIBDEVICE=True)
    types = {a: "i32" for a in fn.arg_names}
    types.update(x_ptr="*fp32", inv_t_ptr="*fp32", seed_ptr="*i64", counter_ptr="*i64", out_ptr="*i64",
                 part_v_ptr="*fp32", part_i_ptr="*i32", bits_ptr="*i64", noise_ptr="*fp32")
    opts = sample._options(c, cuda)
types.update({k: "constexpr" for k in consts})
k = triton.compile(ASTSource(fn, types, consts, {}), target=GPUTarget("cuda", 90, 32), options=opts)
ptx = k.asm["ptx"]
if cfg["kernel"] == "main":
    # uint32 hash: every 32-bit right shift logical, multiplies are mul.lo (wrapping by definition)
    assert "shr.u32" in ptx and not re.search(r"\bshr\.s32\b", ptx), "arithmetic 32-bit shift in the hash"
    assert re.search(r"\bmul\.lo\.[su]32\b", ptx)
    # libdevice's logf (no approximate lg2), and x * inv_temperature rounded on its own (mul.rn)
    assert "lg2.approx" not in ptx and re.search(r"\bmul\.rn(\.ftz)?\.f32\b", ptx), "log or product path"
"""


@pytest.mark.parametrize("cfg", [{"kernel": "main", "partial": False}, {"kernel": "main", "partial": True},
                                 {"kernel": "merge"}])
def test_compiles_for_sm90_without_spills(cfg):
    """The GPU path (libdevice log, mul_rn, uint32 hash, 4096-wide tiles on 8 warps) compiles for the H200
    with this Triton's ptxas, without spilling."""
    from sm90_compile import compile_sm90

    res = compile_sm90(_SM90, cfg)
    assert res["stack"] == 0, res
