"""Fused layer kernels (norm.py, activation.py, rope.py) in the interpreter against their twins in reference.py.

Claims tested: RoPE and the residual sum are bit-exact (fp32, fp16). silu_and_mul rounds exactly as
torch does (bit-exact against an oracle sharing the interpreter's exp) and is within a few fp32 ulps
(one fp16 ulp) of the twin, whose CPU exp (SLEEF) differs from NumPy's. rms_norm is within a few
fp32 ulps (its sum is a tree, not torch's order); in 16 bits almost every output is bit-identical
and none is more than two ulps off. bf16 runs on the GPU only (bench_layer_kernels.py checks it
there): the interpreter stores bf16 as uint16 and gets its arithmetic wrong (a known interpreter trap).
"""
import importlib
import zlib

import numpy as np
import pytest
import torch

from radixkv import kernels
from radixkv.kernels import apply_rope_, rms_norm, silu_and_mul
from radixkv.kernels.reference_layers import apply_rope_ref, rms_norm_ref, silu_and_mul_ref

BF16 = pytest.param(torch.bfloat16, marks=pytest.mark.skip(
    reason="interpreter stores bf16 as uint16 and mis-computes bf16 arithmetic (a known interpreter trap); "
           "checked on the GPU by benchmarks/kernels/bench_layer_kernels.py"))
DTYPES = [torch.float32, torch.float16, BF16]
# rms_norm vs its twin (the sum's order only): a few fp32 ulps; in 16 bits one ulp of the normalised
# value, which the weight multiply can make two of the output
NORM_ULPS = {torch.float32: 8, torch.float16: 2}
EPS = 1e-6


def _gen(*key) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


def _max_ulps(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest |out - ref| in units in the last place of ref (in ref's dtype)."""
    assert out.dtype == ref.dtype and out.shape == ref.shape
    eps = torch.finfo(ref.dtype).eps
    r = ref.double()
    _, e = torch.frexp(r)
    ulp = (eps * torch.pow(2.0, (e - 1).double())).clamp_min(torch.finfo(ref.dtype).tiny * eps)
    return ((out.double() - r).abs() / ulp).max().item() if out.numel() else 0.0


def _weight(shape, dtype, gen):
    return (torch.rand(shape, generator=gen) + 0.5).to(dtype)


# ----------------------------------------------------------------------------- rms_norm
NORM_CASES = {  # name -> (x shape, weight shape, view: x is a head slice of a wider qkv buffer)
    "rows": ((7, 96), (96,), False),  # H not a power of two
    "wide_rows": ((3, 1000), (1000,), False),  # 2 rows a program, the last one masked
    "heads_weight_per_head": ((5, 6, 32), (6, 32), False),  # Qwen3 q/k norm: one weight row per head
    "heads_shared_weight": ((5, 6, 32), (32,), False),
    "heads_strided_view": ((5, 6, 32), (6, 32), True),  # qk = qkv[:, :Hq + Hkv]
}


@pytest.mark.parametrize("case", list(NORM_CASES))
@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_matches_twin(case, dtype):
    shape, wshape, view = NORM_CASES[case]
    gen = _gen("norm", case, str(dtype))
    if view:
        buf = (torch.randn(shape[0], shape[1] + 4, shape[2], generator=gen) * 3).to(dtype)
        x = buf[:, :shape[1]]
        assert not x.is_contiguous()
    else:
        x = (torch.randn(shape, generator=gen) * 3).to(dtype)
    w = _weight(wshape, dtype, gen)
    before = x.clone()
    out, new_res = rms_norm(x, w, EPS)
    ref, _ = rms_norm_ref(x, w, EPS)
    assert new_res is None and out.shape == x.shape and out.dtype == dtype and out.is_contiguous()
    assert torch.equal(x, before), "x must not change"
    assert _max_ulps(out, ref) <= NORM_ULPS[dtype]
    if dtype != torch.float32:
        assert (out != ref).float().mean() < 0.01, "16-bit outputs should almost all be bit-identical"


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_residual_is_added_in_place(dtype):
    gen = _gen("residual", str(dtype))
    x = torch.randn(9, 80, generator=gen).to(dtype)
    buf = (torch.randn(9, 128, generator=gen) * 4).to(dtype)
    residual = buf[:, :80]  # row stride 128
    tail = buf[:, 80:].clone()
    w = _weight(80, dtype, gen)
    ref_res = residual.clone()
    ref, ref_new = rms_norm_ref(x, w, EPS, ref_res)
    out, new_res = rms_norm(x, w, EPS, residual)
    assert new_res is residual, "the new residual is written into residual"
    assert torch.equal(new_res, ref_new) and torch.equal(ref_new, ref_res)  # h = x + residual, bit for bit
    assert torch.equal(buf[:, 80:], tail) and _max_ulps(out, ref) <= NORM_ULPS[dtype]
    again, _ = rms_norm(new_res, w, EPS)  # out is rms_norm(h)
    assert torch.equal(again, out)


def test_rms_norm_out_may_be_x():
    gen = _gen("inplace")
    x = torch.randn(4, 6, 32, generator=gen)
    w = _weight((6, 32), torch.float32, gen)
    want, _ = rms_norm(x, w, EPS)
    out, _ = rms_norm(x, w, EPS, out=x)
    assert out is x and torch.equal(x, want)


def test_rms_norm_empty_batch():
    res = torch.empty(0, 8)
    out, new_res = rms_norm(torch.empty(0, 8), torch.ones(8), EPS, res)
    assert out.shape == (0, 8) and new_res is res


@pytest.mark.parametrize("call, match", [
    (lambda x, w: rms_norm(x[0], w, EPS), "x must be"),
    (lambda x, w: rms_norm(x.int(), w, EPS), "dtype"),
    (lambda x, w: rms_norm(x[:, :5], w, EPS), "weight must be \\[5\\]"),
    (lambda x, w: rms_norm(x.t().contiguous().t(), w, EPS), "last dim must be contiguous"),
    (lambda x, w: rms_norm(x, w[:-1], EPS), "weight must be"),
    (lambda x, w: rms_norm(x, w.half(), EPS), "weight must be"),
    (lambda x, w: rms_norm(x, w, EPS, torch.zeros(4, 9)), "residual must be"),
    (lambda x, w: rms_norm(x, w, EPS, x.half()), "residual must be"),
    (lambda x, w: rms_norm(x, w, EPS, out=torch.empty(4, 8, dtype=torch.float16)), "out must be"),
    (lambda x, w: rms_norm(x, w, EPS, (r := x.clone()), out=r), "out must not be residual"),
])
def test_rms_norm_rejects_bad_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call(torch.randn(4, 8), torch.ones(8))


# ----------------------------------------------------------------------------- silu_and_mul
def _gate_up(dtype, T=6, i=200, row_stride=None, seed=0):
    gen = _gen("silu", str(dtype), seed)
    buf = (torch.randn(T, row_stride or 2 * i, generator=gen) * 4).to(dtype)
    return buf[:, :2 * i]


@pytest.mark.parametrize("row_stride", [None, 448])
@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_matches_twin(dtype, row_stride):
    gu = _gate_up(dtype, row_stride=row_stride)  # I = 200: a masked block
    out = silu_and_mul(gu)
    ref = silu_and_mul_ref(gu)
    assert out.shape == (6, 200) and out.dtype == dtype
    # torch's CPU silu (SLEEF exp) and x / (1 + np.exp(-x)) are each within 2-3 fp32 ulps of the exact value
    assert _max_ulps(out, ref) <= (6 if dtype == torch.float32 else 1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_rounds_as_torch(dtype):
    """With the interpreter's exp on both sides: silu rounded to the dtype, then the product: bit-exact."""
    gu = _gate_up(dtype, T=16, i=256, seed=1)
    gate, up = gu.chunk(2, dim=-1)
    g32 = gate.float()
    e = torch.from_numpy(np.exp(-g32.numpy()))
    silu = (g32 / (1 + e)).to(dtype)  # F.silu: fp32 math, one rounding
    out = silu_and_mul(gu)
    assert torch.equal(out, silu * up)
    if dtype != torch.float32:  # the test can tell: rounding once instead differs
        assert not torch.equal(out, (g32 / (1 + e) * up.float()).to(dtype))


def test_silu_and_mul_out_and_empty():
    gu = _gate_up(torch.float32, T=3, i=64)
    out = torch.full((3, 64), float("nan"))
    assert silu_and_mul(gu, out=out) is out and torch.equal(out, silu_and_mul(gu))
    assert silu_and_mul(torch.empty(0, 128)).shape == (0, 64)


@pytest.mark.parametrize("gate_up, match", [
    (torch.randn(4, 7), "must be \\[T, 2 I\\]"),
    (torch.randn(2, 4, 8), "must be \\[T, 2 I\\]"),
    (torch.randn(4, 8).double(), "dtype"),
    (torch.randn(8, 4).t(), "last dim must be contiguous"),
])
def test_silu_and_mul_rejects_bad_arguments(gate_up, match):
    with pytest.raises(ValueError, match=match):
        silu_and_mul(gate_up)


def test_silu_and_mul_rejects_bad_out():
    with pytest.raises(ValueError, match="out must be"):
        silu_and_mul(torch.randn(4, 8), out=torch.empty(4, 8))


# ----------------------------------------------------------------------------- apply_rope_
def _cos_sin(T, d, dtype, gen, layout):
    """model.py's rope(): fp32 angles of random positions, cos/sin cast to the compute dtype."""
    pos = torch.randint(0, 8192, (T,), generator=gen).float()
    inv = 1.0 / (500000.0 ** (torch.arange(0, d, 2).float() / d))
    emb = torch.cat([pos[:, None] * inv[None, :]] * 2, dim=-1)  # [T, D]
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    return (cos, sin) if layout == "T,D" else (cos[:, None, :], sin[:, None, :])


@pytest.mark.parametrize("layout", ["T,D", "T,1,D"])
# 6 heads: one masked block of 8; 20 heads: 5 blocks of 4; D/2 = 24: masked dims
@pytest.mark.parametrize("hq, hkv, d", [(4, 2, 32), (16, 4, 48)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_is_bit_exact_on_the_qkv_view(dtype, hq, hkv, d, layout):
    gen = _gen("rope", str(dtype), hq, d, layout)
    T = 7
    qkv = (torch.randn(T, hq + 2 * hkv, d, generator=gen) * 2).to(dtype)  # the fused projection output
    cos, sin = _cos_sin(T, d, dtype, gen, layout)
    want = qkv.clone()
    apply_rope_ref(want[:, :hq + hkv], cos, sin)
    qk = qkv[:, :hq + hkv]  # row stride (Hq + 2 Hkv) * D
    assert apply_rope_(qk, cos, sin) is qk
    assert torch.equal(qkv, want), "q/k rotated bit for bit; v untouched"


def test_rope_empty_batch():
    qk = torch.empty(0, 6, 16)
    assert apply_rope_(qk, torch.empty(0, 16), torch.empty(0, 16)) is qk


@pytest.mark.parametrize("qk, cos, match", [
    (torch.randn(3, 16), torch.randn(3, 16), "qk must be"),
    (torch.randn(3, 2, 16).double(), torch.randn(3, 16).double(), "dtype"),
    (torch.randn(3, 2, 15), torch.randn(3, 15), "even"),
    (torch.randn(3, 16, 2).transpose(1, 2), torch.randn(3, 16), "last dim must be contiguous"),
    (torch.randn(3, 2, 16), torch.randn(2, 16), "cos must be"),
    (torch.randn(3, 2, 16), torch.randn(3, 2, 16), "cos must be"),
    (torch.randn(3, 2, 16), torch.randn(3, 16).half(), "cos must be"),
    (torch.randn(3, 2, 16), torch.randn(16, 3).t(), "cos's last dim"),
])
def test_rope_rejects_bad_arguments(qk, cos, match):
    with pytest.raises(ValueError, match=match):
        apply_rope_(qk, cos, cos.clone())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_twins_are_transformers_math(dtype):
    """The twins are transformers' LlamaRMSNorm and rotate-half RoPE, bit for bit (the engine's CPU path)."""

    def _rms_norm(x, weight, eps):
        x32 = x.float()
        return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)

    def _rotate_half(x):
        return torch.cat((-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]), dim=-1)

    gen = _gen("twins", str(dtype))
    h, x = torch.randn(5, 64, generator=gen).to(dtype), torch.randn(5, 64, generator=gen).to(dtype)
    w = _weight(64, dtype, gen)
    res = h.clone()
    out, _ = rms_norm_ref(x, w, EPS, res)
    assert torch.equal(res, h + x) and torch.equal(out, _rms_norm(h + x, w, EPS))
    qk = torch.randn(5, 6, 32, generator=gen).to(dtype)
    cos, sin = _cos_sin(5, 32, dtype, gen, "T,1,D")
    assert torch.equal(apply_rope_ref(qk.clone(), cos, sin), qk * cos + _rotate_half(qk) * sin)


def test_layer_launchers_are_registered():
    for name, module in (("rms_norm", "norm"), ("silu_and_mul", "activation"), ("apply_rope_", "rope")):
        assert name in kernels.__all__
        assert getattr(kernels, name) is getattr(importlib.import_module(f"radixkv.kernels.{module}"), name)


# ----------------------------------------------------------------------------- sm_90 compile
_SM90 = r"""
import json, re
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from radixkv.kernels import activation, norm, rope, rope_store

cuda = torch.device("cuda")  # options only: nothing runs


KERNELS = {"norm": "_rms_norm_kernel", "activation": "_silu_mul_kernel", "rope": "_rope_kernel",
           "rope_store": "_rope_store_kernel"}


def build(module, cfg, ptrs, consts, scalars=None):
    fn = getattr(module, KERNELS[module.__name__.rsplit(".", 1)[1]])
    types = {a: "i32" for a in fn.arg_names}
    types.update(ptrs, **(scalars or {}), **{c: "constexpr" for c in consts})
    k = triton.compile(ASTSource(fn, types, consts, {}), target=GPUTarget("cuda", 90, 32),
                       options=module._options(cfg, cuda))
    ptx = k.asm["ptx"]
    return {"fma": len(re.findall(r"\bfma\.", ptx)), "rsqrt": "rsqrt.approx" in ptx, "ex2": "ex2.approx" in ptx,
            "div_rn": "div.rn.f32" in ptx, "bf16_fma": "fma.rn.bf16" in ptx}


res = {}
for dt in ("bf16", "fp16", "fp32"):
    p = "*" + dt
    c = norm._config(4096)
    res["norm", dt] = build(norm, c, dict(x_ptr=p, res_ptr=p, w_ptr=p, out_ptr=p), dict(
        N=1, H=4096, ROWS=c.block_m, BLOCK=c.block_n, HAS_RESIDUAL=True, WEIGHT_PER_HEAD=False, LIBDEVICE=True),
        {"eps": "fp32"})
    c = norm._config(128)
    res["norm_heads", dt] = build(norm, c, dict(x_ptr=p, res_ptr=p, w_ptr=p, out_ptr=p), dict(
        N=40, H=128, ROWS=c.block_m, BLOCK=c.block_n, HAS_RESIDUAL=False, WEIGHT_PER_HEAD=True, LIBDEVICE=True),
        {"eps": "fp32"})
    c = activation._config(14336)
    res["silu", dt] = build(activation, c, dict(gu_ptr=p, out_ptr=p), dict(I=14336, BLOCK=c.block_n, LIBDEVICE=True))
    c = rope._config(40, 64)
    res["rope", dt] = build(rope, c, dict(qk_ptr=p, cos_ptr=p, sin_ptr=p), dict(
        NUM_HEADS=40, HALF=64, BLOCK_H=c.block_m, BLOCK_HALF=c.block_n))
    c = rope._config(48, 64)
    res["rope_store", dt] = build(rope_store, c, dict(qkv_ptr=p, cos_ptr=p, sin_ptr=p, slots_ptr="*i64", kc_ptr=p,
                                                      vc_ptr=p), dict(
        HQ=32, HKV=8, PAGE_SIZE=16, HALF=64, BLOCK_H=c.block_m, BLOCK_HALF=c.block_n))
print(json.dumps({" ".join(k): v for k, v in res.items()}))
"""


def test_layer_kernels_compile_for_sm90():
    """The GPU path (libdevice calls, launch options) compiles for the H200 with this Triton's ptxas;
    RoPE (and rope_store.py's RoPE with the K/V store) has no FMA (its bit-exactness needs every product
    rounded), silu_and_mul calls libdevice's
    expf and divides correctly rounded, rms_norm uses rsqrtf."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", _SM90], capture_output=True, text=True, env=env, timeout=600)
    if done.returncode != 0 and "ptxas" in done.stderr and "not found" in done.stderr:
        pytest.skip("this Triton has no ptxas")
    assert done.returncode == 0, done.stderr[-3000:]
    res = json.loads(done.stdout.strip().splitlines()[-1])
    for dt in ("bf16", "fp16", "fp32"):
        for rope in (f"rope {dt}", f"rope_store {dt}"):
            assert res[rope]["fma"] == 0 and not res[rope]["bf16_fma"], res[rope]
        assert res[f"silu {dt}"]["ex2"] and res[f"silu {dt}"]["div_rn"], res[f"silu {dt}"]
        assert res[f"norm {dt}"]["rsqrt"] and res[f"norm_heads {dt}"]["rsqrt"]
