"""nucleus_draw: a top-p / min-p draw without sorting the vocabulary, by rejection.

For each row, with y = x * inv_temperature (rounded, as gumbel_argmax), p = softmax(y), the kept set is

    K = {v : mass of the tokens strictly more likely than v < top_p}  and  {v : y_v >= max(y) + log(min_p)}

(the smallest head of the sorted distribution that reaches top_p, and min-p's floor; the most likely
token is always kept; tokens tied with the boundary are all kept). The draw is from p restricted to K:

    A = {v : y_v >= floor};  round r = 0, 1, ...:  t = argmax_{v in A} (y_v + g_r(v))   (Gumbel-max: t ~ p | A)
                             accept t if t is in K, else A = {v in A : y_v > y_t} and go on

Every rejected t is less likely than every token of K, so A always holds K and the accepted token is
distributed as p | K (rejection sampling). A round reads the row twice (the draw, then the mass above
y_t); a row usually accepts in the first round (it is rejected with probability p(A \\ K) / p(A)).
After MAX_ROUNDS rejections the most likely token is taken.

Noise: round 0 is reference_sampling.gumbel's (the same bits as gumbel_argmax, so a row without top-p or min-p
draws the token gumbel_argmax draws); round r > 0 hashes with the key _fmix32(key ^ r * ROUND_MIX).
One program a row (the rounds loop inside it), three passes over the row in the usual case. The twin
is reference_sampling.nucleus_draw_ref; the logs and the sums are the platform's, so the two can differ where
two candidates are within ~1e-6 or where a token's mass above sits within rounding of top_p.
top-k is applied before (the caller masks x below each row's k-th value).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.language.extra import libdevice

from .launch import KernelConfig, for_device, launch_options
from .sample import BIG, _bits, _check, _first_argmax, _fmix32, _gumbel, _row_key

MAX_ROUNDS = 32
ROUND_MIX = 0x27D4EB2F
GPU_CONFIG = KernelConfig(block_m=1, block_n=2048, num_warps=8, num_stages=1)
CPU_CONFIG = KernelConfig(block_m=1, block_n=128, num_warps=1, num_stages=1)


@triton.jit
def _scaled(x_ptr, cols, mask, inv_t, LIBDEVICE: tl.constexpr):
    x = tl.load(x_ptr + cols, mask=mask, other=float("-inf"))
    if LIBDEVICE:
        y = libdevice.mul_rn(x, inv_t)
    else:
        y = x * inv_t
    return tl.where(mask, y, float("-inf"))


@triton.jit
def _nucleus_kernel(x_ptr, inv_t_ptr, top_p_ptr, min_p_ptr, seed_ptr, counter_ptr, out_ptr, rounds_ptr, V, stride_x,
            BLOCK_V: tl.constexpr, MAX_ROUNDS: tl.constexpr, ROUND_MIX: tl.constexpr, LIBDEVICE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    inv_t = tl.load(inv_t_ptr + row)
    top_p = tl.load(top_p_ptr + row)
    min_p = tl.load(min_p_ptr + row)
    key0 = _row_key(tl.load(seed_ptr + row), tl.load(counter_ptr + row))
    lanes = tl.arange(0, BLOCK_V)
    # ---- pass 1: max (and its first id) and the softmax denominator, per lane then reduced
    m_l = tl.full([BLOCK_V], float("-inf"), tl.float32)
    z_l = tl.zeros([BLOCK_V], tl.float32)
    arg_v = tl.full([BLOCK_V], float("-inf"), tl.float32)
    arg_i = lanes
    for off in range(0, V, BLOCK_V):
        cols = off + lanes
        y = _scaled(x_row, cols, cols < V, inv_t, LIBDEVICE)
        take = (y > arg_v) | ((y != y) & (arg_v == arg_v))
        arg_v = tl.where(take, y, arg_v)
        arg_i = tl.where(take, cols, arg_i)
        m_new = tl.maximum(m_l, y)
        z_l = (tl.where(m_l == m_new, z_l, z_l * tl.exp(m_l - m_new))
               + tl.where(y == float("-inf"), 0.0, tl.exp(y - m_new)))
        m_l = m_new
    m = tl.max(m_l, axis=0)
    z = tl.sum(tl.where(m_l == float("-inf"), 0.0, z_l * tl.exp(m_l - m)), axis=0)
    _, top_i = _first_argmax(arg_v, arg_i, BIG)
    floor = m + tl.log(min_p)  # min_p = 0: -inf
    # ---- rounds: draw from A = {y >= floor, y > pivot}, accept if the mass above is below top_p
    pivot = float("-inf")
    tok = -1
    r = 0
    while (tok < 0) & (r < MAX_ROUNDS):
        key = tl.where(r == 0, key0, _fmix32(key0 ^ (r * ROUND_MIX).to(tl.uint32)))
        acc_v = tl.full([BLOCK_V], float("-inf"), tl.float32)
        acc_i = lanes
        acc_y = tl.full([BLOCK_V], float("-inf"), tl.float32)
        for off in range(0, V, BLOCK_V):
            cols = off + lanes
            y = _scaled(x_row, cols, cols < V, inv_t, LIBDEVICE)
            cand = tl.where((y >= floor) & (y > pivot), y + _gumbel(_bits(key, cols), LIBDEVICE), float("-inf"))
            take = cand > acc_v
            acc_v = tl.where(take, cand, acc_v)
            acc_i = tl.where(take, cols, acc_i)
            acc_y = tl.where(take, y, acc_y)
        best_v, t = _first_argmax(acc_v, acc_i, BIG)
        y_t = tl.max(tl.where(acc_i == t, acc_y, float("-inf")), axis=0)
        accept = (top_p >= 1.0) & (best_v > float("-inf"))
        if (top_p < 1.0) & (best_v > float("-inf")):
            above = tl.zeros([BLOCK_V], tl.float32)
            for off in range(0, V, BLOCK_V):
                cols = off + lanes
                y = _scaled(x_row, cols, cols < V, inv_t, LIBDEVICE)
                above += tl.where(y > y_t, tl.exp(y - m), 0.0)
            accept = tl.sum(above, axis=0) < top_p * z
        # nothing left to draw from (a row all -inf or NaN): the most likely token, as argmax gives it
        tok = tl.where(accept, t, tl.where(best_v == float("-inf"), top_i, -1))
        pivot = y_t
        r += 1
    tl.store(rounds_ptr + row, r)
    tl.store(out_ptr + row, tl.where(tok >= 0, tok, top_i).to(tl.int64))


def nucleus_draw(x: Tensor, inv_temperature: Tensor, top_p: Tensor, min_p: Tensor, seed: Tensor, counter: Tensor,
                 rounds: Tensor | None = None) -> Tensor:
    """One draw a row from top-p / min-p filtered softmax(x * inv_temperature) (module docstring).

    x float32 [S, V] (last dim contiguous); inv_temperature, top_p, min_p float32 [S] (top_p in (0, 1],
    min_p in [0, 1]); seed, counter int64 [S] -> token ids int64 [S] on x's device. rounds (optional,
    int32 [S]) receives the rounds each row took. Greedy rows are the caller's."""
    _check(x, inv_temperature, seed, counter)
    S, V = x.shape
    for name, t in (("top_p", top_p), ("min_p", min_p)):
        if not isinstance(t, Tensor) or tuple(t.shape) != (S,) or t.dtype != torch.float32 or t.device != x.device:
            raise ValueError(f"nucleus_draw: {name} must be float32 [{S}] on {x.device}, got "
                             f"{getattr(t, 'dtype', type(t))} {tuple(getattr(t, 'shape', ()))}")
    out = torch.empty(S, dtype=torch.int64, device=x.device)
    if rounds is None:
        rounds = torch.empty(S, dtype=torch.int32, device=x.device)
    if S == 0:
        return out
    cfg = CPU_CONFIG if x.device.type == "cpu" else GPU_CONFIG
    vecs = [t.contiguous() for t in (inv_temperature, top_p, min_p, seed, counter)]
    for_device(_nucleus_kernel, x.device)[(S,)](
        x, *vecs, out, rounds, V, x.stride(0), BLOCK_V=cfg.block_n, MAX_ROUNDS=MAX_ROUNDS, ROUND_MIX=ROUND_MIX,
        LIBDEVICE=x.device.type == "cuda", **launch_options(cfg, x.device))
    return out
