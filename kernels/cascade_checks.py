"""Argument checks of the cascade launchers (cascade.py): the group tensors, q / caches / scales as
paged_decode checks them, the partial states a merge takes and the buffers a launch writes into.
Shapes and dtypes always; the values of index tensors on CPU only (checks.py's rule)."""
from __future__ import annotations

import itertools

import torch
from torch import Tensor

from .checks import IndexValueError, as_index, check_paged_args, check_tensor


def check_groups(fn: str, q: Tensor, k_cache: Tensor, prefix_pages: Tensor, prefix_lens: Tensor,
                  group_start: Tensor, group_rows: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Shapes and dtypes always; on CPU also the values (IndexValueError naming the argument)."""
    pages = as_index(fn, "prefix_pages", prefix_pages, None, 2)
    G = pages.shape[0]
    lens = as_index(fn, "prefix_lens", prefix_lens, (G,), 1)
    start = as_index(fn, "group_start", group_start, (G + 1,), 1)
    rows = as_index(fn, "group_rows", group_rows, None, 1)
    if len({t.device for t in (q, prefix_pages, prefix_lens, group_start, group_rows)}) != 1:
        raise ValueError(f"{fn}: prefix_pages, prefix_lens, group_start and group_rows must be on q's device {q.device}")
    if q.device.type != "cpu":
        return pages, lens, start, rows
    num_pages, page_size = k_cache.shape[0], k_cache.shape[1]
    B, R, cap = q.shape[0], rows.shape[0], pages.shape[1] * page_size
    s = start.tolist()
    if s[0] != 0 or s[-1] > R or any(a > b for a, b in itertools.pairwise(s)):
        raise IndexValueError(f"{fn}: group_start must rise from 0 to len(group_rows) = {R} at most, got {s}")
    r = rows.tolist()[: s[-1]]  # entries past the last group's rows are unused (a static plan's padding)
    bad = [x for x in r if not 0 <= x < B]
    if bad or len(set(r)) != len(r):
        why = f"row {bad[0]} outside q's {B} rows" if bad else "a row in two groups"
        raise IndexValueError(f"{fn}: group_rows holds {why}")
    for g, n in enumerate(lens.tolist()):
        if not 0 <= n <= cap:
            raise IndexValueError(f"{fn}: prefix_lens[{g}] = {n} out of range [0, {cap}] (prefix_pages rows of "
                                  f"{pages.shape[1]} pages x {page_size} tokens)")
        used = pages[g, : -(-n // page_size)]
        if used.numel() and not (0 <= int(used.min()) and int(used.max()) < num_pages):
            j = int(((used < 0) | (used >= num_pages)).nonzero()[0])
            raise IndexValueError(f"{fn}: prefix_pages[{g}, {j}] = {int(used[j])} out of range [0, {num_pages})")
    return pages, lens, start, rows


def check_float_cache(fn: str, k_cache: Tensor) -> None:
    if k_cache.dtype == torch.uint8:
        raise ValueError(f"{fn}: INT4/INT2 (uint8) pages are not supported by the cascade kernels yet")


def check_attention_args(fn: str, q: Tensor, k_cache: Tensor, v_cache: Tensor, k_scale: Tensor | None,
                          v_scale: Tensor | None) -> bool:
    """q, caches and scales as paged_decode checks them (checks.check_paged_args, through an empty page
    table, so the group tensors keep their own names in check_groups). Returns whether pages are FP8."""
    dev = q.device if isinstance(q, Tensor) else None
    empty = torch.zeros(0, 1, dtype=torch.int32, device=dev)
    args = check_paged_args(fn, q, k_cache, v_cache, empty, empty[:, 0], k_scale, v_scale)
    check_float_cache(fn, k_cache)
    return args.fp8


def check_out_states(fn: str, out: object, shape: tuple[int, int, int],
                      device: torch.device) -> tuple[Tensor, Tensor]:
    """out = (o float32 [B, Hq, S, D], lse float32 [B, Hq, S]) on `device` for shape (B, Hq, D), any S >= 1,
    else ValueError naming it."""
    if not (isinstance(out, tuple) and len(out) == 2 and all(isinstance(t, Tensor) for t in out)
            and out[0].dim() == 4):
        raise ValueError(f"{fn}: out must be a pair of tensors (o [B, Hq, S, D], lse [B, Hq, S])")
    o, lse = out
    B, hq, d = shape
    for name, t, want in (("o", o, (B, hq, o.shape[2], d)), ("lse", lse, (B, hq, o.shape[2]))):
        if tuple(t.shape) != want or t.dtype != torch.float32 or t.device != device:
            raise ValueError(f"{fn}: out's {name} must be float32 {list(want)} on {device}, got {t.dtype} "
                             f"{list(t.shape)} on {t.device}")
    return o, lse


def as_states(fn: str, name: str, o: Tensor, lse: Tensor) -> tuple[Tensor, Tensor]:
    """o [B, Hq, D] / lse [B, Hq] (one state) or o [B, Hq, S, D] / lse [B, Hq, S], as 4-D / 3-D views."""
    if not isinstance(o, Tensor) or o.dim() not in (3, 4):
        raise ValueError(f"{fn}: o_{name} must be a [B, Hq, D] or [B, Hq, S, D] tensor, got "
                         f"{tuple(o.shape) if isinstance(o, Tensor) else type(o).__name__}")
    check_tensor(fn, f"o_{name}", o, o.dim(), (torch.float32, torch.float16, torch.bfloat16))
    check_tensor(fn, f"lse_{name}", lse, o.dim() - 1, (torch.float32,))
    if o.dim() == 3:
        o, lse = o.unsqueeze(2), lse.unsqueeze(2)
    if tuple(lse.shape) != tuple(o.shape[:3]):
        raise ValueError(f"{fn}: lse_{name} shape {tuple(lse.shape)} does not match o_{name} {tuple(o.shape)}")
    return o, lse
