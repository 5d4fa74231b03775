"""Argument checks of the kernel launchers, the one home of those of the paged launchers (store_kv, paged_decode,
paged_prefill) and of their twins in reference_attention.py. Shapes, dtypes and devices are checked on every
call (host metadata, free). The VALUES of the index tensors are checked only when they are on the
CPU (the interpreter's and reference_attention.py's path), before anything is written; a bad one raises
IndexValueError (both an IndexError and a ValueError) naming the argument, its index and value:
    slots           in [0, num_pages * page_size)    (no padding sentinel: pad with a real scratch slot)
    seq_lens        in [1 (decode) or 0 (prefill), max_pages * page_size]
    page_table      in [0, num_pages) for the pages a row uses (entries j < ceil(seq_lens[b] / page_size));
                    the rest of the row is never read
    q_lens          in [0, seq_lens[b]]  (the new tokens are the last of the sequence)
    q_start         rows q_start[b] : q_start[b] + q_lens[b] inside q's T rows, disjoint between requests
    max_q_len       >= max(q_lens) when given
The fast path is one min/max reduction per index tensor and, for prefill, one Python pass over the B
rows, so the CPU engine (reference_attention.py) pays next to nothing. Host numbers (sm_scale, num_splits,
max_q_len, rms_norm's eps) are checked on every device.
Cache formats (check_scales): 16/32-bit pages take no scales; FP8 pages k_scale, v_scale [P, S, Hkv];
INT4/INT2 pages are uint8 [P, S, Hkv, D * bits / 8] (bits read from the ratio of q's or k's head_dim to
the packed width, cache_bits) with k_scale, v_scale float16 [P, S, Hkv, G, 2] (intq.py's format).
On CUDA tensors the launchers never read these values: a check would be a host sync per launch
(and cannot run inside CUDA-graph capture). There they are the CALLER's duty; out of range, the
kernels read or write outside the caches (silent corruption or an illegal address), and a decode
row with seq_lens 0 gives NaN when split. The engine builds them on the host (Scheduler, Batch,
PagedAttention.plan, which range-checks the page table) and the CUDA-graph runner pads with a real
scratch slot and page.
"""
from __future__ import annotations

import math
import operator
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from .fp8 import is_fp8
from .intq import INT_BITS, SCALE_DTYPE, bits_of, format_error, packed_dim, planes


class IndexValueError(IndexError, ValueError):
    """An index argument holds a value outside its range (raised before anything is written).
    Both an IndexError and a ValueError, as numpy's AxisError is."""


# uint8: INT4 / INT2 pages, packed (kernels/intq.py)
CACHE_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2, torch.uint8)
Q_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def values_on_host(*tensors: Tensor) -> bool:
    """Whether the values of `tensors` can be checked without a device sync (all on the CPU)."""
    return all(t.device.type == "cpu" for t in tensors)


def _host(t: Tensor) -> np.ndarray:
    """A CPU index tensor's values as an int64 NumPy array (to find a bad value once the fast path failed)."""
    return t.numpy().astype(np.int64, copy=False)


def _raise_first(fn: str, name: str, values: np.ndarray, bad: np.ndarray, want: Any) -> None:
    """Raise IndexValueError for the first True of `bad` (values' shape), naming name[index] = value."""
    index = tuple(int(i) for i in np.argwhere(bad)[0])
    where = ", ".join(map(str, index))
    raise IndexValueError(f"{fn}: {name}[{where}] = {int(values[index])} {want(index) if callable(want) else want}")


def _in_range(t: Tensor, lo: int, hi: int) -> bool:
    """All values of the CPU tensor t in [lo, hi]: the fast path of the value checks, one reduction
    (a few microseconds on the engine's tensors)."""
    if t.numel() == 0:
        return True
    t_lo, t_hi = torch.aminmax(t)
    return lo <= int(t_lo) and int(t_hi) <= hi


def check_tensor(fn: str, name: str, t: Any, dim: int, dtypes: tuple[torch.dtype, ...] | None = None) -> Tensor:
    """t is a Tensor of `dim` dimensions (and of one of `dtypes`), else ValueError naming it."""
    if not isinstance(t, Tensor):
        raise ValueError(f"{fn}: {name} must be a tensor, got {type(t).__name__}")
    if t.dim() != dim:
        raise ValueError(f"{fn}: {name} must be {dim}-D, got shape {tuple(t.shape)}")
    if dtypes is not None and t.dtype not in dtypes:
        raise ValueError(f"{fn}: {name} dtype {t.dtype} not supported ({', '.join(map(str, dtypes))})")
    return t


class KVQuant(NamedTuple):
    """What a checked cache holds: FP8 values with per-row scales, or INT codes of `bits` (4, 2) with
    group scales (0: neither)."""

    fp8: bool
    bits: int


def cache_bits(fn: str, k_cache: Tensor, head_dim: int) -> int:
    """0 for float caches; for uint8 (INT4/INT2) caches the bits of the values their packed rows hold
    for head_dim values (4 or 2), else ValueError naming the mismatch."""
    if k_cache.dtype != torch.uint8:
        return 0
    width = k_cache.shape[-1]
    bits = bits_of(width, head_dim)
    if not bits:
        want = ", ".join(f"int{b}: {packed_dim(head_dim, b)}" for b in INT_BITS if head_dim % planes(b) == 0)
        raise ValueError(f"{fn}: uint8 (INT4/INT2) pages of {width} bytes a row do not hold rows of head_dim "
                         f"{head_dim} (bytes a row: {want or 'none: head_dim must be even'})")
    return bits


def check_scales(fn: str, k_cache: Tensor, k_scale: Tensor | None, v_scale: Tensor | None,
                 head_dim: int) -> KVQuant:
    """FP8 caches need k_scale, v_scale float32/float16 [P, S, Hkv] of one dtype and strides; INT4/INT2
    (uint8) caches float16 [P, S, Hkv, G, 2] (scale, zero) with G groups of whole bit-planes or whole
    groups a plane (kernels/intq.py, format_error); others none. head_dim: the values a row holds (q's or k's last dim)."""
    bits = cache_bits(fn, k_cache, head_dim)
    if bits:
        _check_int_scales(fn, k_cache, k_scale, v_scale, bits)
        return KVQuant(False, bits)
    if not is_fp8(k_cache.dtype):
        if k_scale is not None or v_scale is not None:
            raise ValueError(f"{fn}: scales given for a non-FP8 cache ({k_cache.dtype})")
        return KVQuant(False, 0)
    want = tuple(k_cache.shape[:3])
    for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
        if not isinstance(s, Tensor) or tuple(s.shape) != want or s.dtype not in (torch.float32, torch.float16):
            raise ValueError(f"{fn}: FP8 cache needs {name} float32 or float16 {want}")
        if s.device != k_cache.device:
            raise ValueError(f"{fn}: {name} must be on {k_cache.device}, got {s.device}")
    if k_scale.stride() != v_scale.stride() or k_scale.dtype != v_scale.dtype:
        raise ValueError(f"{fn}: k_scale and v_scale must share dtype and strides")
    return KVQuant(True, 0)


def _check_int_scales(fn: str, k_cache: Tensor, k_scale: Tensor | None, v_scale: Tensor | None, bits: int) -> None:
    lead = tuple(k_cache.shape[:3])
    head_dim = k_cache.shape[3] * planes(bits)
    groups = [g for g in (1, 2, 4, 8, 16, 32) if g <= head_dim and format_error(head_dim, bits, g) is None]
    want = f"float16 {lead + ('G', 2)} (scale, zero) with G in {groups}"
    for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
        got = f"{s.dtype} {tuple(s.shape)}" if isinstance(s, Tensor) else type(s).__name__
        if not isinstance(s, Tensor) or s.dtype != SCALE_DTYPE or s.dim() != 5 or tuple(s.shape[:3]) != lead \
                or s.shape[4] != 2 or s.shape[3] not in groups:
            raise ValueError(f"{fn}: int{bits} cache needs {name} {want}, got {got}")
        if s.device != k_cache.device:
            raise ValueError(f"{fn}: {name} must be on {k_cache.device}, got {s.device}")
    if k_scale.shape != v_scale.shape or k_scale.stride() != v_scale.stride():
        raise ValueError(f"{fn}: k_scale and v_scale must share shape and strides, got {tuple(k_scale.shape)} "
                         f"{k_scale.stride()} and {tuple(v_scale.shape)} {v_scale.stride()}")


def check_slots(fn: str, slots: Tensor, k_cache: Tensor) -> None:
    """Host values only: every slot in [0, num_pages * page_size)."""
    if not values_on_host(slots):
        return
    num_slots = k_cache.shape[0] * k_cache.shape[1]
    if not _in_range(slots, 0, num_slots - 1):
        a = _host(slots)
        _raise_first(fn, "slots", a, (a < 0) | (a >= num_slots),
                     f"out of range [0, {num_slots}) ({k_cache.shape[0]} pages x {k_cache.shape[1]} slots)")


def check_page_values(fn: str, page_table: Tensor, seq_lens: Tensor, k_cache: Tensor, min_seq_len: int) -> None:
    """Host values only: seq_lens in [min_seq_len, max_pages * page_size], and the page ids each row
    uses (its first ceil(seq_lens[b] / page_size) entries) in [0, num_pages)."""
    if not values_on_host(page_table, seq_lens):
        return
    num_pages, page_size = k_cache.shape[0], k_cache.shape[1]
    width = page_table.shape[1]
    cap = width * page_size
    if not _in_range(seq_lens, min_seq_len, cap):
        lens = _host(seq_lens)
        _raise_first(fn, "seq_lens", lens, (lens < min_seq_len) | (lens > cap),
                     f"out of range [{min_seq_len}, {cap}] (page_table rows of {width} pages x {page_size} tokens)")
    if _in_range(page_table, 0, num_pages - 1):
        return
    lens, table = _host(seq_lens), _host(page_table)
    used = np.arange(width) < (-(-lens // page_size))[:, None]  # [B, max_pages]: entries row b reads
    bad = used & ((table < 0) | (table >= num_pages))
    if bad.any():
        _raise_first(fn, "page_table", table, bad,
                     lambda ix: f"out of range [0, {num_pages}) (a page of seq_lens[{ix[0]}] = "
                                f"{int(lens[ix[0]])} tokens)")


def check_q_rows(fn: str, num_rows: int, q_start: Tensor, q_lens: Tensor, seq_lens: Tensor,
                 max_q_len: int | None) -> None:
    """Host values only: q_lens[b] in [0, seq_lens[b]], rows q_start[b] : q_start[b] + q_lens[b] inside
    [0, num_rows) and disjoint between requests, max_q_len (if given) >= max(q_lens). One pass over
    the rows in Python (B values: cheaper than tensor ops at the engine's batch sizes)."""
    if not values_on_host(q_start, q_lens, seq_lens):
        return
    lens, starts, seqs = q_lens.tolist(), q_start.tolist(), seq_lens.tolist()
    in_order, last_end = True, 0  # the engine's batches: each request's rows after the previous one's
    for b, (n, s0, total) in enumerate(zip(lens, starts, seqs)):
        if not 0 <= n <= total:
            raise IndexValueError(f"{fn}: q_lens[{b}] = {n} out of range [0, seq_lens[{b}] = {total}] "
                                  "(the new tokens are the last of the sequence)")
        if s0 < 0 or s0 + n > num_rows:
            raise IndexValueError(f"{fn}: q_start[{b}] = {s0} with q_lens[{b}] = {n}: rows outside q's "
                                  f"{num_rows} rows")
        if n:
            in_order = in_order and s0 >= last_end
            last_end = s0 + n
    if lens and max_q_len is not None and max_q_len < max(lens):
        b = lens.index(max(lens))
        raise IndexValueError(f"{fn}: max_q_len = {max_q_len} is below q_lens[{b}] = {lens[b]}")
    if in_order:
        return
    owned = sorted((s0, b) for b, (s0, n) in enumerate(zip(starts, lens)) if n)  # by first row, then request
    for (s_a, a), (s_b, b) in zip(owned, owned[1:]):
        if s_b < s_a + lens[a]:
            raise IndexValueError(f"{fn}: q rows of requests {a} ({s_a}:{s_a + lens[a]}) and {b} "
                                  f"({s_b}:{s_b + lens[b]}) overlap")


class PagedArgs(NamedTuple):
    """Checked launcher arguments: index tensors as contiguous int32, whether pages are FP8, and the bits
    of INT4/INT2 pages (0 for other pages)."""

    page_table: Tensor  # int32 [B, max_pages]
    seq_lens: Tensor  # int32 [B]
    fp8: bool
    bits: int


def as_index(fn: str, name: str, t: Tensor, shape: tuple[int, ...] | None, dim: int) -> Tensor:
    """An integer tensor as contiguous int32 (int64 inputs are converted on the device, no host sync).
    Values are not checked here (the check_*_values functions do, on the original tensors: an int64
    value past int32 would wrap in the conversion)."""
    if not isinstance(t, Tensor) or t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise ValueError(f"{fn}: {name} must be an integer tensor (int32), got {getattr(t, 'dtype', type(t))}")
    if t.dim() != dim or (shape is not None and tuple(t.shape) != shape):
        want = shape if shape is not None else f"{dim}-D"
        raise ValueError(f"{fn}: {name} must have shape {want}, got {tuple(t.shape)}")
    if t.dtype != torch.int32 or not t.is_contiguous():
        t = t.to(torch.int32).contiguous()
    return t


def check_paged_args(fn: str, q: Tensor, k_cache: Tensor, v_cache: Tensor, page_table: Tensor, seq_lens: Tensor,
                     k_scale: Tensor | None, v_scale: Tensor | None, min_seq_len: int = 0) -> PagedArgs:
    """Shared checks of the attention launchers (raise ValueError naming the problem); on CPU also
    the values of seq_lens and page_table (check_page_values; min_seq_len 1 for decode)."""
    check_tensor(fn, "q", q, 3, Q_DTYPES)
    check_tensor(fn, "k_cache", k_cache, 4, CACHE_DTYPES)
    check_tensor(fn, "v_cache", v_cache, 4)
    _, page_size, hkv, width = k_cache.shape
    if v_cache.shape != k_cache.shape or v_cache.dtype != k_cache.dtype or v_cache.stride() != k_cache.stride():
        raise ValueError(f"{fn}: k_cache and v_cache must share shape, dtype and strides")
    if page_size == 0:
        raise ValueError(f"{fn}: caches {tuple(k_cache.shape)} have pages of 0 slots")
    d = q.shape[2]
    packed = cache_bits(fn, k_cache, d) > 0  # INT4/INT2 rows hold d values in fewer bytes
    if hkv == 0 or (width != d and not packed) or q.shape[1] % hkv != 0:
        raise ValueError(f"{fn}: q {tuple(q.shape)} does not fit caches with {hkv} KV heads of dim {width}")
    table = as_index(fn, "page_table", page_table, None, 2)
    lens = as_index(fn, "seq_lens", seq_lens, (table.shape[0],), 1)
    quant = check_scales(fn, k_cache, k_scale, v_scale, d)
    if len({t.device for t in (q, k_cache, v_cache, page_table, seq_lens)}) != 1:
        raise ValueError(f"{fn}: all tensors must be on one device")
    check_page_values(fn, page_table, seq_lens, k_cache, min_seq_len)
    return PagedArgs(table, lens, quant.fp8, quant.bits)


def check_ragged_rows(fn: str, q: Tensor, q_start: Tensor, q_lens: Tensor, seq_lens: Tensor,
                      max_q_len: int | None) -> tuple[Tensor, Tensor, int | None]:
    """paged_prefill's q_start, q_lens (int [B], on q's device) as contiguous int32 and max_q_len as an
    int (or None); on CPU also their values (check_q_rows)."""
    B = seq_lens.shape[0]
    starts = as_index(fn, "q_start", q_start, (B,), 1)
    lens = as_index(fn, "q_lens", q_lens, (B,), 1)
    if q_start.device != q.device or q_lens.device != q.device:
        raise ValueError(f"{fn}: q_start and q_lens must be on {q.device}")
    if max_q_len is not None:
        max_q_len = host_int(fn, "max_q_len", max_q_len)
    check_q_rows(fn, q.shape[0], q_start, q_lens, seq_lens, max_q_len)
    return starts, lens, max_q_len


def host_int(fn: str, name: str, n: Any, lo: int = 0) -> int:
    """A host integer >= lo (Python or NumPy int; not bool, float or a tensor)."""
    if isinstance(n, (bool, Tensor)):
        raise ValueError(f"{fn}: {name} must be a host int >= {lo}, got {n!r}")
    try:
        n = operator.index(n)
    except TypeError:
        raise ValueError(f"{fn}: {name} must be a host int >= {lo}, got {n!r}") from None
    if n < lo:
        raise ValueError(f"{fn}: {name} must be >= {lo}, got {n}")
    return n


def host_float(fn: str, name: str, x: Any, positive: bool = False) -> float:
    """A finite host float (positive if asked)."""
    try:
        x = float(x)
    except (TypeError, ValueError):
        raise ValueError(f"{fn}: {name} must be a float, got {x!r}") from None
    if not math.isfinite(x) or (positive and not x > 0):
        raise ValueError(f"{fn}: {name} must be {'positive and ' if positive else ''}finite, got {x}")
    return x
