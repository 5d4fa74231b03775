"""gumbel_argmax: the sampler's Gumbel-max draw in one pass over each row of logits.

    token[s] = argmax_v( x[s, v] * inv_temperature[s] + g(seed[s], counter[s], v) )

g is reference_sampling.gumbel's noise: reference_sampling.uniform_bits' 32-bit hash of (seed, counter, vocab id),
computed here in uint32 (wrapping multiplies, logical shifts), bit for bit the same;
u = ((bits >> 8) + 0.5) * 2**-24 in float32, clamped to 1 - 2**-24; g = -log(-log(u)). The product
x * inv_temperature is rounded before g is added (never contracted into an FMA), as the twin does.

Argmax rules, those of torch.argmax (and so of reference_sampling.gumbel_argmax_ref):
- ties: the first (lowest) vocab id of the maximum wins;
- NaN (NaN logits, or x * inv_temperature = inf * 0): above everything, the first NaN wins;
- -inf entries (filtered tokens): g is finite, so they stay -inf and never beat a finite entry;
  a row all -inf gives 0 (several +inf: the first +inf).

Rounding: the hash bits, u and the product are exact matches of the twin. The logs are the
platform's: on the GPU libdevice's logf (what torch's CUDA log calls, so the noise should equal
reference_sampling.gumbel's on the GPU bit for bit; unverified until run there), in the interpreter NumPy's,
which differs from torch's CPU log in the last bit for about 20% of inputs. Near g = 0 (u ~ 1/e) the
outer log amplifies that bit: the noise is within a few ulps of max(1, |g|) of the twin's (tests),
so tokens differ only where two candidates are closer than about 1e-6. Triton links libdevice with
flush-to-zero: a subnormal product x * inv_temperature becomes 0 on the GPU (the logs' arguments and
results are never subnormal), immaterial next to noise of magnitude >= 2**-24.

Grid (S, splits): each program scans a chunk of whole BLOCK_V tiles of one row, keeping a running
(value, id) per lane, and reduces its lanes at the end. With one split it writes the token; with
more, partial (value, id) pairs go to a [S, splits] scratch and _merge_kernel reduces them in split
order (same rules). Splits are picked so that about two programs run per multiprocessor: one
program per row would leave most of an H200 idle below ~130 rows (about 60 integer and float
operations per logit; timings in benchmarks/RESULTS.md, "Engine at the floor").
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.language.extra import libdevice

from .dispatch import sm_count
from .launch import KernelConfig, for_device, launch_options

U_MAX = tl.constexpr(1.0 - 2.0**-24)  # reference_sampling.U_MAX: the largest float32 below 1
MAX_VOCAB = 2**31 - 2
BIG = tl.constexpr(MAX_VOCAB + 1)  # an id no row reaches
GPU_CONFIG = KernelConfig(block_m=1, block_n=4096, num_warps=8, num_stages=1)
CPU_CONFIG = KernelConfig(block_m=1, block_n=128, num_warps=1, num_stages=1)
PROGRAMS_PER_SM = 2
# GPU: FMA contraction on for libdevice's logf (compiled contracted inside torch's CUDA log, as nvcc
# does by default); the one product of the kernel's own math is mul_rn, which is never contracted.
FP_FUSION = True


@triton.jit
def _fmix32(h):
    """MurmurHash3's finaliser on uint32 (reference_sampling._fmix32)."""
    h = h ^ (h >> 16)
    h = h * 0x85EBCA6B
    h = h ^ (h >> 13)
    h = h * 0xC2B2AE35
    return h ^ (h >> 16)


@triton.jit
def _row_key(seed, counter):
    """A row's 32-bit hash key from its int64 seed and counter (reference_sampling.uniform_bits' key)."""
    lo = (seed & 0xFFFFFFFF).to(tl.uint32)
    hi = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)
    c = (counter & 0xFFFFFFFF).to(tl.uint32)
    return _fmix32(lo ^ _fmix32(hi ^ _fmix32(c ^ 0x68E31DA4)))


@triton.jit
def _bits(key, cols):
    """uint32 hash bits of vocab ids `cols` under a row key (reference_sampling.uniform_bits)."""
    return _fmix32(_fmix32(key ^ (cols.to(tl.uint32) * 0x9E3779B9)) ^ (key >> 7))


@triton.jit
def _gumbel(bits, LIBDEVICE: tl.constexpr):
    """Gumbel noise from hash bits: u = ((bits >> 8) + 0.5) * 2**-24 clamped to U_MAX, g = -log(-log(u))."""
    u = tl.minimum(((bits >> 8).to(tl.float32) + 0.5) * 5.9604644775390625e-08, U_MAX)  # * 2**-24, exact
    if LIBDEVICE:
        return -libdevice.log(-libdevice.log(u))
    return -tl.log(-tl.log(u))


@triton.jit
def _first_argmax(v, i, BIG: tl.constexpr):
    """(value, id) of a 1-D block under torch.argmax's rules, the ids i telling the order:
    a NaN beats everything (the lowest id of a NaN), else the lowest id of the maximum."""
    isnan = v != v
    nan_i = tl.min(tl.where(isnan, i, BIG), axis=0)
    m = tl.max(tl.where(isnan, float("-inf"), v), axis=0)
    max_i = tl.min(tl.where(v == m, i, BIG), axis=0)
    has_nan = nan_i < BIG
    return tl.where(has_nan, float("nan"), m), tl.where(has_nan, nan_i, max_i)


@triton.jit
def _sample_kernel(x_ptr, inv_t_ptr, seed_ptr, counter_ptr, out_ptr, part_v_ptr, part_i_ptr, bits_ptr, noise_ptr,
            V, chunk, stride_x, stride_t, stride_s, stride_c,
            BLOCK_V: tl.constexpr, PARTIAL: tl.constexpr, DEBUG: tl.constexpr, LIBDEVICE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    seed = tl.load(seed_ptr + row * stride_s)  # int64
    counter = tl.load(counter_ptr + row * stride_c)  # int64
    inv_t = tl.load(inv_t_ptr + row * stride_t)  # float32
    key = _row_key(seed, counter)  # as reference_sampling.uniform_bits: 32-bit words split on int64, then uint32 math
    start = split * chunk
    end = tl.minimum(start + chunk, V)
    lanes = tl.arange(0, BLOCK_V)
    acc_v = tl.full([BLOCK_V], float("-inf"), tl.float32)  # per lane: best value so far ...
    acc_i = start + lanes  # ... and its id (lane ids rise, so keeping the first on ties is `>`)
    for off in range(0, end - start, BLOCK_V):  # from 0 (the interpreter's trap with NumPy 2.4)
        cols = start + off + lanes  # int32 vocab ids
        mask = cols < end
        x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
        bits = _bits(key, cols)
        g = _gumbel(bits, LIBDEVICE)
        if LIBDEVICE:
            y = libdevice.mul_rn(x, inv_t) + g
        else:
            y = x * inv_t + g
        if DEBUG:
            tl.store(bits_ptr + row * V + cols, bits.to(tl.int64), mask=mask)
            tl.store(noise_ptr + row * V + cols, g, mask=mask)
        y = tl.where(mask, y, float("-inf"))
        take = (y > acc_v) | ((y != y) & (acc_v == acc_v))  # a NaN takes over (once) and stays
        acc_v = tl.where(take, y, acc_v)
        acc_i = tl.where(take, cols, acc_i)
    best_v, best_i = _first_argmax(acc_v, acc_i, BIG)
    if PARTIAL:
        n_split = tl.num_programs(1)
        tl.store(part_v_ptr + row * n_split + split, best_v)
        tl.store(part_i_ptr + row * n_split + split, best_i)
    else:
        tl.store(out_ptr + row, best_i.to(tl.int64))


@triton.jit
def _merge_kernel(part_v_ptr, part_i_ptr, out_ptr, n_split, BLOCK_S: tl.constexpr):
    """One row's split partials (in split order, so in id order) -> its token."""
    row = tl.program_id(0).to(tl.int64)
    s = tl.arange(0, BLOCK_S)
    mask = s < n_split
    v = tl.load(part_v_ptr + row * n_split + s, mask=mask, other=float("-inf"))
    i = tl.load(part_i_ptr + row * n_split + s, mask=mask, other=BIG)
    _, best_i = _first_argmax(v, i, BIG)
    tl.store(out_ptr + row, best_i.to(tl.int64))


def _config(device: torch.device) -> KernelConfig:
    return CPU_CONFIG if device.type == "cpu" else GPU_CONFIG


def _options(cfg: KernelConfig, device: torch.device) -> dict:
    opts = launch_options(cfg, device)
    if device.type != "cpu":
        opts["enable_fp_fusion"] = FP_FUSION
    return opts


def default_splits(S: int, V: int, block_v: int, device: torch.device) -> int:
    """Programs a row: one on CPU; on the GPU enough for PROGRAMS_PER_SM a multiprocessor, whole tiles each."""
    if device.type == "cpu":
        return 1
    return max(1, min(triton.cdiv(V, block_v), triton.cdiv(PROGRAMS_PER_SM * sm_count(device), S)))


def _check(x: Tensor, inv_temperature: Tensor, seed: Tensor, counter: Tensor) -> None:
    if not isinstance(x, Tensor) or x.dim() != 2 or x.dtype != torch.float32:
        raise ValueError(f"gumbel_argmax: x must be float32 [S, V], got "
                         f"{getattr(x, 'dtype', type(x))} {tuple(getattr(x, 'shape', ()))}")
    S, V = x.shape
    if not 1 <= V <= MAX_VOCAB:
        raise ValueError(f"gumbel_argmax: the vocabulary must have 1 to {MAX_VOCAB} entries, got {V}")
    if S and V > 1 and x.stride(1) != 1:
        raise ValueError(f"gumbel_argmax: x's last dim must be contiguous (stride 1), got strides {x.stride()}")
    for name, t, dtype in (("inv_temperature", inv_temperature, torch.float32), ("seed", seed, torch.int64),
                           ("counter", counter, torch.int64)):
        if not isinstance(t, Tensor) or tuple(t.shape) != (S,) or t.dtype != dtype or t.device != x.device:
            raise ValueError(f"gumbel_argmax: {name} must be {dtype} [{S}] on {x.device}, got "
                             f"{getattr(t, 'dtype', type(t))} {tuple(getattr(t, 'shape', ()))} "
                             f"on {getattr(t, 'device', None)}")


def _launch(x: Tensor, inv_temperature: Tensor, seed: Tensor, counter: Tensor, block_v: int, splits: int,
            bits: Tensor | None = None, noise: Tensor | None = None) -> Tensor:
    S, V = x.shape
    out = torch.empty(S, dtype=torch.int64, device=x.device)
    if S == 0:
        return out
    chunk = triton.cdiv(triton.cdiv(V, splits), block_v) * block_v  # whole tiles a program
    splits = triton.cdiv(V, chunk)  # no program without a column
    partial = splits > 1
    if partial:
        part_v = torch.empty((S, splits), dtype=torch.float32, device=x.device)
        part_i = torch.empty((S, splits), dtype=torch.int32, device=x.device)
    else:
        part_v, part_i = x, out  # placeholders: never touched
    debug = bits is not None
    cfg = KernelConfig(block_m=1, block_n=block_v, num_warps=_config(x.device).num_warps, num_stages=1)
    kernel = for_device(_sample_kernel, x.device)
    kernel[(S, splits)](
        x, inv_temperature, seed, counter, out, part_v, part_i, bits if debug else out, noise if debug else x,
        V, chunk, x.stride(0), inv_temperature.stride(0), seed.stride(0), counter.stride(0),
        BLOCK_V=block_v, PARTIAL=partial, DEBUG=debug, LIBDEVICE=x.device.type == "cuda", **_options(cfg, x.device))
    if partial:
        merge = for_device(_merge_kernel, x.device)
        merge[(S,)](part_v, part_i, out, splits, BLOCK_S=triton.next_power_of_2(splits),
                    **launch_options(KernelConfig(1, 1, 1, 1), x.device))
    return out


def gumbel_argmax(x: Tensor, inv_temperature: Tensor, seed: Tensor, counter: Tensor, *,
                  splits: int | None = None) -> Tensor:
    """One Gumbel-max draw a row: x float32 [S, V] (any row stride, last dim contiguous), inv_temperature
    float32 [S], seed and counter int64 [S] (SamplingRows' meaning) -> token ids int64 [S] on x's device.

    token = argmax(x * inv_temperature[:, None] + reference_sampling.gumbel(seed, counter, V)) under torch.argmax's
    rules (module docstring: ties, NaN, -inf). Greedy rows are the caller's: their inv_temperature is
    only required not to make NaN (1.0 does). splits: programs a row (None: default_splits); results
    do not depend on it.
    """
    _check(x, inv_temperature, seed, counter)
    S, V = x.shape
    block_v = _config(x.device).block_n
    if splits is None:
        splits = default_splits(S, V, block_v, x.device)
    elif not isinstance(splits, int) or splits < 1:
        raise ValueError(f"gumbel_argmax: splits must be an int >= 1, got {splits!r}")
    return _launch(x, inv_temperature, seed, counter, block_v, splits)


def gumbel_argmax_debug(x: Tensor, inv_temperature: Tensor, seed: Tensor, counter: Tensor, block_v: int,
                        splits: int = 1) -> tuple[Tensor, Tensor, Tensor]:
    """Test path: gumbel_argmax with a chosen tile and split count that also writes the kernel's hash
    bits (int64 [S, V], as reference_sampling.uniform_bits) and noise (float32 [S, V], as reference_sampling.gumbel)."""
    _check(x, inv_temperature, seed, counter)
    S, V = x.shape
    bits = torch.empty((S, V), dtype=torch.int64, device=x.device)
    noise = torch.empty((S, V), dtype=torch.float32, device=x.device)
    return _launch(x, inv_temperature, seed, counter, block_v, splits, bits, noise), bits, noise
