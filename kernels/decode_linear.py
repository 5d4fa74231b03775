"""decode_linear: a decode batch's projection y = x W^T (x: M <= 64 rows) with its neighbours fused in.

One kernel a projection instead of a GEMM plus one or two elementwise kernels (issue 35):

    norm      x is the residual stream h; each program takes RMSNorm's rstd of its rows first and feeds
              round(round(h * rstd) * ln_w) to the product (norm.rms_norm's rounding, without its kernel).
              rstd comes from h's sums of squares in parts (ssq [M, P] float32, written by the kernel that
              last added into h: "residual" with ssq_out), or without them from a pass over h first
    epilogue  "store":    out = y
              "residual": out += y in place (out is h: the o_proj / down_proj residual add); with ssq_out
                          [M, partials(N)] each program also writes the sum of squares of its columns of
                          the new h (the next norm's input, deterministic: no atomics)
              "silu_mul": W = [gate | up] ([2 N, K]); out = silu(y_gate) * y_up ([M, N])
              "rope":     W = [q | k | v] heads of head_dim D; q and k heads rotated (rope.apply_rope_'s
                          rounding); q (and k, v unless stored) written to out [M, (Hq + 2 Hkv) D];
                          with caches given, k and v go straight into their page slots (store_kv's layout,
                          pages in the activations' dtype)

Rounding as the unfused ops: fp32 accumulation rounded once to the dtype (y), then each elementwise step
rounded as its own kernel rounds. The sums differ in order from cuBLAS's (and rstd's from norm.py's), so
outputs agree with the unfused chain to a few ulps, not bit for bit.

Tiles: a program owns BLOCK_N output columns (two tiles of BLOCK_N rows of W for silu_mul and rope: gate and
up, or a head's two halves) and all M rows (padded to 16 for the tensor cores, to 64 above 16 rows), and
streams its [BLOCK_N, K] slab of W in BLOCK_K steps through Triton's software pipeline (num_stages). A tile
may split K into shares (decode_linear_tiles.Tile.split_k): each share leaves its partial sums in a
SplitScratch and the last to finish adds them in share order and runs the epilogue, which needs whole sums.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.language.extra import libdevice
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .checks import check_slots, host_float
from .decode_linear_tiles import MAX_ROWS, Epilogue, SplitScratch, rope_block_n, tile
from .dispatch import pdl_enabled
from .launch import KernelConfig, for_device, launch_options

_EPILOGUES = {"store": 0, "residual": 1, "silu_mul": 2, "rope": 3}
DTYPES = (torch.float16, torch.bfloat16)


@triton.jit
def _prefetch_l2(ptrs):
    """Ask L2 for the lines at ptrs (no registers wait for them)."""
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];", "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _decode_linear_kernel(
        x_ptr, stride_xm, ln_ptr, eps, ssq_ptr, stride_sm, ssq_out_ptr, stride_so, w_ptr, stride_wn, out_ptr,
        stride_om, cos_ptr, sin_ptr, stride_cm, kc_ptr, vc_ptr, slots_ptr, stride_cp, stride_cs, stride_ch,
        M, N: tl.constexpr, K: tl.constexpr, EPILOGUE: tl.constexpr, NORM: tl.constexpr, PARTS: tl.constexpr,
        BLOCK_P: tl.constexpr, WRITE_SSQ: tl.constexpr, LIBDEVICE: tl.constexpr,
        HEAD_DIM: tl.constexpr, Q_HEADS: tl.constexpr, KV_HEADS: tl.constexpr, PAGE_SIZE: tl.constexpr,
        STORE_KV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        PDL: tl.constexpr, PREFETCH_K: tl.constexpr, ws_ptr, cnt_ptr, N_W: tl.constexpr, SPLIT_K: tl.constexpr,
        K_SPLIT: tl.constexpr):
    pid = tl.program_id(0)
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < M
    offs = tl.arange(0, BLOCK_N)
    dtype = out_ptr.dtype.element_ty
    TWO: tl.constexpr = EPILOGUE >= 2
    HALF: tl.constexpr = HEAD_DIM // 2
    if EPILOGUE == 3:  # a head's columns j*BLOCK_N + offs of both halves
        tiles: tl.constexpr = HALF // BLOCK_N
        head = pid // tiles
        d = (pid % tiles) * BLOCK_N + offs  # [BLOCK_N] within the half
        cols_a = head * HEAD_DIM + d
        cols_b = cols_a + HALF
    else:
        head = 0
        d = offs
        cols_a = pid * BLOCK_N + offs
        cols_b = cols_a + N  # silu_mul: the up rows of W
    amask = cols_a < N
    x_rows = x_ptr + rows.to(tl.int64)[:, None] * stride_xm
    wa_rows = w_ptr + cols_a.to(tl.int64)[:, None] * stride_wn
    wb_rows = w_ptr + cols_b.to(tl.int64)[:, None] * stride_wn
    if PDL:  # launched early (programmatic dependent launch): fetch the first of W while the previous kernel ends
        gdc_launch_dependents()  # the next kernel may start its own prefetch once every program here has begun
        lines = tl.arange(0, PREFETCH_K // 64) * 64  # a 128-byte line every 64 values
        safe = tl.where(amask, 0, -cols_a).to(tl.int64)[:, None] * stride_wn  # rows past N: row 0's lines
        _prefetch_l2(wa_rows + safe + lines[None, :])
        if TWO:
            _prefetch_l2(wb_rows + safe + lines[None, :])
        gdc_wait()  # everything the previous kernel wrote is visible from here; nothing is read or written before
    # ---- norm: rstd of each row, as norm.py takes it
    if NORM:
        if PARTS > 0:  # the producer's sums of squares, PARTS a row
            p = tl.arange(0, BLOCK_P)
            ss = tl.sum(tl.load(ssq_ptr + rows[:, None] * stride_sm + p[None, :],
                                mask=rmask[:, None] & (p < PARTS)[None, :], other=0.0), axis=1)
        else:
            ss = tl.zeros([BLOCK_M], dtype=tl.float32)
            for k0 in range(0, K, BLOCK_K):
                ks = k0 + tl.arange(0, BLOCK_K)
                h = tl.load(x_rows + ks[None, :], mask=rmask[:, None] & (ks < K)[None, :], other=0.0).to(tl.float32)
                ss += tl.sum(h * h, axis=1)
        if LIBDEVICE:
            rstd = libdevice.rsqrt(ss * (1.0 / K) + eps)
        else:
            rstd = tl.math.rsqrt(ss / K + eps)
    # ---- y = x W^T over the program's columns: [BLOCK_M, BLOCK_N] fp32 (two of them for silu_mul / rope)
    acc_a = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_b = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    k_lo = tl.program_id(2) * K_SPLIT  # this program's share of K (all of it without a split)
    for k0 in range(k_lo, k_lo + K_SPLIT, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        kmask = (ks < K)[None, :]
        x = tl.load(x_rows + ks[None, :], mask=rmask[:, None] & kmask, other=0.0)  # [BLOCK_M, BLOCK_K]
        if NORM:
            ln = tl.load(ln_ptr + ks, mask=ks < K, other=0.0).to(tl.float32)
            x = ((x.to(tl.float32) * rstd[:, None]).to(dtype).to(tl.float32) * ln[None, :]).to(dtype)
        wa = tl.load(wa_rows + ks[None, :], mask=amask[:, None] & kmask, other=0.0)  # [BLOCK_N, BLOCK_K]
        acc_a = tl.dot(x, tl.trans(wa), acc_a)
        if TWO:
            wb = tl.load(wb_rows + ks[None, :], mask=amask[:, None] & kmask, other=0.0)
            acc_b = tl.dot(x, tl.trans(wb), acc_b)
    if SPLIT_K > 1:  # leave the partial sums; the split that finishes last adds them in order and goes on
        ws_rows = ws_ptr + (tl.program_id(2) * M + rows.to(tl.int64))[:, None] * N_W
        pmask = rmask[:, None] & amask[None, :]
        tl.store(ws_rows + cols_a[None, :], acc_a, mask=pmask)
        if TWO:
            tl.store(ws_rows + cols_b[None, :], acc_b, mask=pmask)
        tl.debug_barrier()  # every thread's partials written before the count says so (release below)
        cnt = cnt_ptr + pid * tl.num_programs(1) + tl.program_id(1)
        lane = tl.arange(0, BLOCK_M)
        # (as a [BLOCK_M] mask: the interpreter stores under tensor masks only)
        last = tl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu") + lane * 0 == SPLIT_K - 1
        rmask = rmask & last  # only the last split reads the partials and writes anything below
        pmask = rmask[:, None] & amask[None, :]
        acc_a = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        acc_b = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for sp in tl.static_range(SPLIT_K):
            sp_rows = ws_ptr + (sp * M + rows.to(tl.int64))[:, None] * N_W
            acc_a += tl.load(sp_rows + cols_a[None, :], mask=pmask, other=0.0, cache_modifier=".cg")
            if TWO:
                acc_b += tl.load(sp_rows + cols_b[None, :], mask=pmask, other=0.0, cache_modifier=".cg")
        tl.store(cnt + lane * 0, lane * 0, mask=last & (lane == 0))  # ready for the next launch
    ya = acc_a.to(dtype).to(tl.float32)  # what F.linear returns, rounded once
    omask = rmask[:, None] & amask[None, :]
    out_rows = out_ptr + rows.to(tl.int64)[:, None] * stride_om
    if EPILOGUE == 0:
        tl.store(out_rows + cols_a[None, :], ya.to(dtype), mask=omask)
    elif EPILOGUE == 1:
        h = (ya + tl.load(out_rows + cols_a[None, :], mask=omask, other=0.0).to(tl.float32)).to(dtype)
        tl.store(out_rows + cols_a[None, :], h, mask=omask)
        if WRITE_SSQ:
            h = tl.where(omask, h.to(tl.float32), 0.0)
            tl.store(ssq_out_ptr + rows * stride_so + pid, tl.sum(h * h, axis=1), mask=rmask)
    elif EPILOGUE == 2:
        yb = acc_b.to(dtype).to(tl.float32)
        if LIBDEVICE:
            e = libdevice.exp(-ya)
        else:
            e = tl.exp(-ya)
        silu = tl.math.div_rn(ya, 1.0 + e).to(dtype).to(tl.float32)
        tl.store(out_rows + cols_a[None, :], (silu * yb).to(dtype), mask=omask)
    else:
        yb = acc_b.to(dtype).to(tl.float32)
        if head < Q_HEADS + KV_HEADS:  # q and k heads rotate; every product and the sum rounded
            c_rows = rows.to(tl.int64)[:, None] * stride_cm
            cos_a = tl.load(cos_ptr + c_rows + d[None, :], mask=rmask[:, None], other=0.0).to(tl.float32)
            cos_b = tl.load(cos_ptr + c_rows + HALF + d[None, :], mask=rmask[:, None], other=0.0).to(tl.float32)
            sin_a = tl.load(sin_ptr + c_rows + d[None, :], mask=rmask[:, None], other=0.0).to(tl.float32)
            sin_b = tl.load(sin_ptr + c_rows + HALF + d[None, :], mask=rmask[:, None], other=0.0).to(tl.float32)
            ra = (ya * cos_a).to(dtype).to(tl.float32) - (yb * sin_a).to(dtype).to(tl.float32)
            rb = (yb * cos_b).to(dtype).to(tl.float32) + (ya * sin_b).to(dtype).to(tl.float32)
            ya, yb = ra, rb
        kv_head = head - Q_HEADS
        if STORE_KV and kv_head >= 0:  # k or v: into its page slot
            slot = tl.load(slots_ptr + rows, mask=rmask, other=0).to(tl.int64)
            cache = kc_ptr
            if kv_head >= KV_HEADS:
                cache = vc_ptr
                kv_head -= KV_HEADS
            base = ((slot // PAGE_SIZE) * stride_cp + (slot % PAGE_SIZE) * stride_cs + kv_head * stride_ch)[:, None]
            tl.store(cache + base + d[None, :], ya.to(dtype), mask=rmask[:, None])
            tl.store(cache + base + HALF + d[None, :], yb.to(dtype), mask=rmask[:, None])
        else:
            tl.store(out_rows + cols_a[None, :], ya.to(dtype), mask=omask)
            tl.store(out_rows + cols_b[None, :], yb.to(dtype), mask=omask)


# With programmatic dependent launch each program asks L2 for the first PREFETCH_K values of its W rows
# before it waits for the previous kernel: the DRAM stream runs on across the kernel boundary.
PREFETCH_K = 1024


def _overlap(a: Tensor, b: Tensor) -> bool:
    """Whether the bytes a and b span intersect."""
    a0, b0 = a.data_ptr(), b.data_ptr()
    a1 = a0 + (a.shape[0] - 1) * a.stride(0) * a.element_size() + a.shape[-1] * a.element_size() if a.numel() else a0
    b1 = b0 + (b.shape[0] - 1) * b.stride(0) * b.element_size() + b.shape[-1] * b.element_size() if b.numel() else b0
    return a0 < b1 and b0 < a1


def _check(name: str, t: object, shape: tuple[int, ...], like: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    dtype = dtype or like.dtype
    if not isinstance(t, Tensor):
        raise ValueError(f"decode_linear: {name} must be a tensor, got {type(t).__name__}")
    if tuple(t.shape) != shape or t.dtype != dtype or t.device != like.device or t.stride(-1) != 1:
        raise ValueError(f"decode_linear: {name} must be {dtype} {list(shape)} on {like.device} with a contiguous "
                         f"last dim, got {t.dtype} {list(t.shape)} on {t.device}, strides {t.stride()}")
    return t


def decode_linear(x: Tensor, w: Tensor, epilogue: Epilogue = "store", *, out: Tensor | None = None,
                  norm: tuple[Tensor, float] | None = None, ssq: Tensor | None = None,
                  ssq_out: Tensor | None = None, rope: tuple[Tensor, Tensor] | None = None,
                  heads: tuple[int, int, int] | None = None,
                  kv: tuple[Tensor, Tensor, Tensor] | None = None,
                  config: KernelConfig | None = None, block_k: int | None = None,
                  split_k: int | None = None, scratch: SplitScratch | None = None) -> Tensor:
    """y = x W^T with the module docstring's fusions; returns out.

    x: [M, K] (M <= 64; with `norm`, the residual stream h). w: [N_w, K], row-major.
    norm: (ln_weight [K], eps): x is normalised by RMSNorm first (rstd in fp32, as norm.rms_norm), from
    ssq (float32 [M, P]: x's sums of squares in P parts, e.g. a "residual" launch's ssq_out) when given.
    epilogue "store": out [M, N_w] (fresh when None). "residual": out [M, N_w] given, out += y; ssq_out
    (float32 [M, partials(N_w, device, M)]) receives the new out's sums of squares by column tile.
    "silu_mul": N_w = 2 N, out [M, N] = silu(gate) * up. "rope": heads = (Hq, Hkv, D) with
    N_w = (Hq + 2 Hkv) D, rope = (cos, sin) [M, D] or [M, 1, D] in x's dtype, out [M, N_w] (q | k | v);
    kv = (k_cache, v_cache [P, S, Hkv, D] in x's dtype, slots int64 [M]): k and v are written into the
    caches at slots instead of out (out's k and v columns are left as they were).
    config / block_k / split_k: override the tile (benchmarks).
    scratch: where a launch split over K leaves its partials (SplitScratch); a fresh one when None, which a
    CUDA graph must not capture (it would be freed under the graph).
    """
    if not isinstance(x, Tensor) or x.dim() != 2:
        raise ValueError(f"decode_linear: x must be [M, K], got {getattr(x, 'shape', type(x))}")
    if x.dtype not in DTYPES:
        raise ValueError(f"decode_linear: dtype {x.dtype} not supported (float16 / bfloat16)")
    if x.stride(1) != 1:
        raise ValueError(f"decode_linear: x's last dim must be contiguous, got strides {x.stride()}")
    M, K = x.shape
    if M > MAX_ROWS:
        raise ValueError(f"decode_linear: {M} rows > {MAX_ROWS} (a decode batch; larger ones take a GEMM)")
    if epilogue not in _EPILOGUES:
        raise ValueError(f"decode_linear: epilogue must be one of {list(_EPILOGUES)}, got {epilogue!r}")
    if not isinstance(w, Tensor) or w.dim() != 2 or w.shape[1] != K:
        raise ValueError(f"decode_linear: w must be [N, {K}], got {getattr(w, 'shape', type(w))}")
    _check("w", w, tuple(w.shape), x)
    n_w = w.shape[0]
    n = n_w // 2 if epilogue == "silu_mul" else n_w
    if epilogue == "silu_mul" and n_w % 2:
        raise ValueError(f"decode_linear: silu_mul needs w = [gate | up] with an even row count, got {n_w}")
    cfg, bk, splits = tile(epilogue, x.device, M)
    if config is not None:
        cfg, bk = config, block_k or bk
    splits = splits if split_k is None else split_k
    if not isinstance(splits, int) or splits < 1:
        raise ValueError(f"decode_linear: split_k must be a positive int, got {splits!r}")
    hq = hkv = hd = 0
    cos = sin = None
    if epilogue == "rope":
        if heads is None or rope is None:
            raise ValueError("decode_linear: epilogue 'rope' needs heads=(Hq, Hkv, D) and rope=(cos, sin)")
        hq, hkv, hd = heads
        if min(heads) < 1 or hd % 2 or (hq + 2 * hkv) * hd != n_w:
            raise ValueError(f"decode_linear: heads {heads} do not cover w's {n_w} rows as (Hq + 2 Hkv) * D, D even")
        bn = rope_block_n(hd, cfg.block_n)
        if not bn:
            raise ValueError(f"decode_linear: head_dim {hd}: half a head must be a multiple of a power-of-two tile")
        cos, sin = (c.reshape(M, hd) if isinstance(c, Tensor) and c.numel() == M * hd else c for c in rope)
        _check("cos", cos, (M, hd), x)
        _check("sin", sin, (M, hd), x)
        if sin.stride(0) != cos.stride(0):
            raise ValueError("decode_linear: cos and sin must share their row stride")
        cfg = cfg._replace(block_n=bn)
    elif rope is not None or kv is not None or heads is not None:
        raise ValueError("decode_linear: rope, heads and kv go with epilogue 'rope' only")
    if epilogue == "residual" and out is None:
        raise ValueError("decode_linear: epilogue 'residual' adds into out: give out (the residual stream)")
    if out is not None and isinstance(out, Tensor) and _overlap(out, x):
        raise ValueError("decode_linear: out must not overlap x (programs would read what others wrote)")
    out = torch.empty((M, n), dtype=x.dtype, device=x.device) if out is None else _check("out", out, (M, n), x)
    tiles = (hq + 2 * hkv) * (hd // 2 // cfg.block_n) if epilogue == "rope" else triton.cdiv(n, cfg.block_n)
    ln, eps = x, 0.0  # placeholders without norm
    if norm is not None:
        ln = _check("norm weight", norm[0], (K,), x)
        eps = host_float("decode_linear", "eps", norm[1])
    elif ssq is not None:
        raise ValueError("decode_linear: ssq (sums of squares) goes with norm only")
    if ssq is not None:
        _check("ssq", ssq, (M, ssq.shape[-1] if isinstance(ssq, Tensor) and ssq.dim() == 2 else -1), x, torch.float32)
    if ssq_out is not None:
        if epilogue != "residual":
            raise ValueError("decode_linear: ssq_out goes with epilogue 'residual' only")
        _check("ssq_out", ssq_out, (M, tiles), x, torch.float32)
    kc = vc = slots = x  # placeholders without kv
    strides = (0, 0, 0)
    page_size = 1
    if kv is not None:
        kc, vc, slots = kv
        _check("k_cache", kc, tuple(getattr(kc, "shape", ())), x)
        if kc.dim() != 4 or kc.shape[2:] != (hkv, hd) or vc.shape != kc.shape or vc.stride() != kc.stride():
            raise ValueError(f"decode_linear: caches must be [P, S, {hkv}, {hd}] with one layout, got "
                             f"{list(kc.shape)} / {list(getattr(vc, 'shape', ()))}")
        _check("v_cache", vc, tuple(kc.shape), x)
        if not isinstance(slots, Tensor) or slots.shape != (M,) or slots.dtype != torch.int64 or slots.device != x.device:
            raise ValueError(f"decode_linear: slots must be int64 [{M}] on {x.device}")
        check_slots("decode_linear", slots, kc)
        strides, page_size = kc.stride()[:3], kc.shape[1]
    if M == 0:
        return out
    parts = ssq.shape[1] if ssq is not None else 0
    k_split = triton.cdiv(triton.cdiv(K, splits), bk) * bk  # each share a whole number of BLOCK_K steps
    splits = triton.cdiv(K, k_split)
    row_tiles = triton.cdiv(M, cfg.block_m)
    ws = cnt = x  # placeholders without a split
    if splits > 1:
        need = (splits * M * n_w, tiles * row_tiles)
        scratch = SplitScratch(x.device, *need) if scratch is None else scratch
        if not isinstance(scratch, SplitScratch) or scratch.partials.device != x.device:
            raise ValueError(f"decode_linear: scratch must be a SplitScratch on {x.device}")
        if scratch.partials.numel() < need[0] or scratch.counters.numel() < need[1]:
            raise ValueError(f"decode_linear: scratch holds {scratch.partials.numel()} partials and "
                             f"{scratch.counters.numel()} counters; this launch needs {need[0]} and {need[1]}")
        ws, cnt = scratch.partials, scratch.counters
    opts = launch_options(cfg, x.device)
    if x.device.type == "cuda":
        opts["enable_fp_fusion"] = False  # the elementwise steps rounded one by one, as the unfused kernels
    pdl = pdl_enabled(x.device)
    if pdl:
        opts["launch_pdl"] = True
    for_device(_decode_linear_kernel, x.device)[(tiles, row_tiles, splits)](
        x, x.stride(0), ln, float(eps), ssq if ssq is not None else x, ssq.stride(0) if ssq is not None else 0,
        ssq_out if ssq_out is not None else x, ssq_out.stride(0) if ssq_out is not None else 0,
        w, w.stride(0), out, out.stride(0),
        cos if cos is not None else x, sin if sin is not None else x, cos.stride(0) if cos is not None else 0,
        kc, vc, slots, *strides, M,
        N=n, K=K, EPILOGUE=_EPILOGUES[epilogue], NORM=norm is not None, PARTS=parts,
        BLOCK_P=triton.next_power_of_2(max(parts, 1)), WRITE_SSQ=ssq_out is not None,
        LIBDEVICE=x.device.type == "cuda", HEAD_DIM=max(hd, 2), Q_HEADS=hq, KV_HEADS=hkv, PAGE_SIZE=page_size,
        STORE_KV=kv is not None, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=bk, PDL=pdl,
        PREFETCH_K=min(PREFETCH_K, triton.next_power_of_2(K)), ws_ptr=ws, cnt_ptr=cnt, N_W=n_w, SPLIT_K=splits,
        K_SPLIT=k_split, **opts)
    return out
