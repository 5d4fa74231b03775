"""Cascade (shared-prefix) decode kernels (kernels/cascade.py) under the interpreter vs their twins
(kernels/reference_attention.py) and vs plain paged_decode over the whole page tables.

Batches: groups of rows share their first pages (ragged group sizes and prefix lengths, groups of one),
other rows are in no group; every row has its own tail pages. FP8 pages are quantised with torch
(quantize_fp8) and laid out head-major as KVStore does; the kernels only dequantise. q is fp32/fp16
(bf16 is GPU-only: the interpreter computes bf16 dots wrongly).
"""
import zlib

import pytest
import torch
from radixkv.kernels import IndexValueError, paged_decode
from radixkv.kernels.cascade import (
    cascade_decode,
    cascade_prefix_attention,
    merge_attention_states,
    paged_decode_partial,
)
from radixkv.kernels.cascade_plan import CascadePlan, plan_cascade, prefix_num_splits
from radixkv.kernels.dequant_pages import dequant_pages
from radixkv.kernels.fp8 import quantize_fp8
from radixkv.kernels.reference_attention import (
    cascade_decode_ref,
    cascade_prefix_attention_ref,
    merge_attention_states_ref,
    paged_decode_partial_ref,
)

DTYPES = {  # cache dtype name -> (cache dtype, q dtype, tolerance)
    "fp32": (torch.float32, torch.float32, 1e-5),
    "fp16": (torch.float16, torch.float16, 2e-3),
    "fp8_e4m3": (torch.float8_e4m3fn, torch.float16, 2e-3),
    "fp8_e5m2": (torch.float8_e5m2, torch.float16, 2e-3),
}
I32 = torch.int32


def _gen(*key):
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


def _caches(num_pages, page_size, hkv, d, kv_dtype, gen):
    """Random K/V pages (FP8: quantised by torch, head-major pages and float16 scales as KVStore lays them)."""
    cache_dt = DTYPES[kv_dtype][0]
    k, v = (torch.randn(num_pages, page_size, hkv, d, generator=gen) for _ in range(2))
    if cache_dt not in (torch.float8_e4m3fn, torch.float8_e5m2):
        return k.to(cache_dt), v.to(cache_dt), None, None
    out = []
    for x in (k, v):
        xq, xs = quantize_fp8(x, cache_dt, torch.float16)  # [P, S, Hkv, D], [P, S, Hkv]
        pages = torch.empty(num_pages, hkv, page_size, d, dtype=cache_dt).transpose(1, 2)
        scales = torch.empty(num_pages, hkv, page_size, dtype=torch.float16).transpose(1, 2)
        pages.copy_(xq)
        scales.copy_(xs)
        out.append((pages, scales))
    (kq, ks), (vq, vs) = out
    return kq, vq, ks, vs


def _batch(groups, lone, page_size, gen, max_private=9):
    """groups: (rows, shared pages) per group; lone: rows in no group. Every row gets 1..max_private own
    tokens after its group's run (on shuffled pages). Returns (page tables, seq_lens, plan groups, pages)."""
    rows_total = sum(n for n, _ in groups) + lone
    private = torch.randint(1, max_private + 1, (rows_total,), generator=gen).tolist()
    need = sum(p for _, p in groups) + sum(-(-n // page_size) for n in private)
    perm = torch.randperm(need + 2, generator=gen).tolist()
    tables, lens, spec, b = [], [], [], 0
    for n_rows, shared in list(groups) + [(1, 0)] * lone:
        run = [perm.pop() for _ in range(shared)]
        rows = []
        for _ in range(n_rows):
            own = [perm.pop() for _ in range(-(-private[b] // page_size))]
            tables.append(run + own)
            lens.append(shared * page_size + private[b])
            rows.append(b)
            b += 1
        if shared:
            spec.append((rows, shared * page_size))
    order = torch.randperm(rows_total, generator=gen).tolist()  # groups' rows need not be neighbours
    where = {old: new for new, old in enumerate(order)}
    tables, lens = [tables[o] for o in order], [lens[o] for o in order]
    spec = [([where[r] for r in rows], n) for rows, n in spec]
    return tables, lens, spec, need + 2


def _dense_table(tables):
    width = max(len(t) for t in tables)
    return torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=I32)


def _close(out, ref, tol):
    assert not torch.isnan(out).any(), "NaN in the output"
    torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)


def _states_close(o, lse, ro, rl, tol):
    """States equal where the twin has keys; empty states have lse -inf (o unread)."""
    live = torch.isfinite(rl)
    assert torch.equal(torch.isfinite(lse), live), "empty / non-empty states differ"
    _close(lse[live], rl[live], tol)
    _close(o[live], ro[live], tol)


# ----------------------------------------------------------------------------- the shared-prefix kernel
@pytest.mark.parametrize("page_size, group, kv_dtype", [
    (16, 1, "fp32"), (1, 3, "fp16"), (16, 8, "fp8_e4m3"), (1, 8, "fp32"), (16, 4, "fp16"), (1, 1, "fp8_e4m3"),
])
def test_prefix_matches_twin(page_size, group, kv_dtype):
    """Ragged groups (3, 1 and 2 rows over 2, 1 and 1 shared pages at page 16) and a row in no group,
    unsplit (state for state) and split into 3 (merged, against the twin's single state)."""
    gen = _gen("prefix", page_size, group, kv_dtype)
    hkv, d = 2, 32
    pages = (2, 1, 1) if page_size == 16 else (24, 7, 11)
    tables, lens, spec, num_pages = _batch([(3, pages[0]), (1, pages[1]), (2, pages[2])], 1, page_size, gen)
    kc, vc, ks, vs = _caches(num_pages, page_size, hkv, d, kv_dtype, gen)
    q = torch.randn(len(lens), hkv * group, d, generator=gen).to(DTYPES[kv_dtype][1])
    g = plan_cascade(tables, lens, spec, page_size, "cpu").groups
    args = (q, kc, vc, g.prefix_pages, g.prefix_lens, g.group_start, g.group_rows, 0.3, ks, vs)
    ro, rl = cascade_prefix_attention_ref(*args)
    tol = DTYPES[kv_dtype][2]
    o, lse = cascade_prefix_attention(*args, max_group_rows=g.max_group_rows, num_splits=1)
    _states_close(o, lse, ro, rl, tol)
    o, lse = cascade_prefix_attention(*args, max_group_rows=g.max_group_rows, num_splits=3)
    assert o.shape == (len(lens), hkv * group, 3, d) and lse.shape == (len(lens), hkv * group, 3)
    mo, ml = merge_attention_states(o, lse, o[:, :, :0], lse[:, :, :0], return_lse=True)
    _states_close(mo, ml, ro[:, :, 0], rl[:, :, 0], tol)


def test_prefix_unaligned_lengths_empty_groups_and_more_splits_than_keys():
    """The kernel takes any prefix length (not only whole pages), a group with a 0-token prefix
    (lse -inf), a group of no rows (padding), more splits than key tiles (empty splits), and its
    default grid (max_group_rows None)."""
    gen = _gen("unaligned")
    kc, vc, _, _ = _caches(12, 4, 1, 16, "fp32", gen)
    q = torch.randn(6, 4, 16, generator=gen)
    prefix_pages = torch.tensor([[3, 7, 1, 0], [5, 2, 0, 0], [4, 4, 0, 0], [9, 0, 0, 0]], dtype=I32)
    prefix_lens = torch.tensor([13, 0, 6, 3], dtype=I32)
    group_start = torch.tensor([0, 2, 3, 3, 5], dtype=I32)
    group_rows = torch.tensor([4, 0, 2, 5, 1], dtype=I32)  # row 3 in no group
    args = (q, kc, vc, prefix_pages, prefix_lens, group_start, group_rows)
    ro, rl = cascade_prefix_attention_ref(*args)
    assert torch.isinf(rl[[2, 3]]).all()
    for splits in (1, 5):
        o, lse = cascade_prefix_attention(*args, num_splits=splits)
        mo, ml = merge_attention_states(o, lse, o[:, :, :0], lse[:, :, :0], return_lse=True)
        _states_close(mo, ml, ro[:, :, 0], rl[:, :, 0], 1e-5)
        assert (o[3] == 0).all() and torch.isinf(lse[3]).all(), "a row in no group must have empty states"


# ----------------------------------------------------------------------------- suffix and merge
@pytest.mark.parametrize("kv_dtype", ["fp32", "fp8_e4m3"])
def test_decode_partial_matches_twin_and_paged_decode(kv_dtype):
    """paged_decode_partial's states equal the twin's; merged they are paged_decode; empty rows are empty."""
    gen = _gen("partial", kv_dtype)
    _, q_dt, tol = DTYPES[kv_dtype]
    kc, vc, ks, vs = _caches(20, 4, 2, 32, kv_dtype, gen)
    table = torch.randperm(20, generator=gen)[:16].to(I32).view(4, 4)
    lens = torch.tensor([13, 0, 16, 1], dtype=I32)
    q = torch.randn(4, 8, 32, generator=gen).to(q_dt)
    ro, rl = paged_decode_partial_ref(q, kc, vc, table, lens, k_scale=ks, v_scale=vs)
    o, lse = paged_decode_partial(q, kc, vc, table, lens, k_scale=ks, v_scale=vs)
    _states_close(o, lse, ro, rl, tol)
    o, lse = paged_decode_partial(q, kc, vc, table, lens, k_scale=ks, v_scale=vs, num_splits=3)
    live = lens > 0
    merged = merge_attention_states(o, lse, o[:, :, :0], lse[:, :, :0], out_dtype=q.dtype)
    ref = paged_decode(q[live], kc, vc, table[live], lens[live], k_scale=ks, v_scale=vs)
    _close(merged[live], ref, tol)
    assert (merged[~live] == 0).all()


def test_merge_matches_twin_with_empty_states_and_mixed_ranks():
    """3-D and 4-D states, empty states holding NaN garbage (never read), a row empty everywhere."""
    gen = _gen("merge")
    B, hq, d = 3, 5, 24  # head_dim and heads not powers of two
    o_a = torch.randn(B, hq, 3, d, generator=gen)
    lse_a = torch.randn(B, hq, 3, generator=gen) * 20
    o_b = torch.randn(B, hq, d, generator=gen)
    lse_b = torch.randn(B, hq, generator=gen) * 20
    lse_a[0, :, 1] = float("-inf")
    o_a[0, :, 1] = float("nan")
    lse_b[1] = float("-inf")
    o_b[1] = float("nan")
    lse_a[2, 4], lse_b[2, 4] = float("-inf"), float("-inf")  # (row 2, head 4): no keys at all
    o_a[2, 4] = float("nan")
    out, lse = merge_attention_states(o_a, lse_a, o_b, lse_b, return_lse=True)
    ref, ref_lse = merge_attention_states_ref(o_a, lse_a, o_b, lse_b, return_lse=True)
    _close(out, ref, 1e-5)
    torch.testing.assert_close(lse, ref_lse)
    assert (out[2, 4] == 0).all() and lse[2, 4] == float("-inf")
    # merging is associative: (a, b) as one state merged with nothing equals the two-way merge
    half = merge_attention_states(o_a[:, :, :1], lse_a[:, :, :1], o_a[:, :, 1:], lse_a[:, :, 1:], return_lse=True)
    _close(merge_attention_states(half[0], half[1], o_b, lse_b), out, 1e-5)
    into = torch.full((B, hq, d), float("nan"), dtype=torch.float16)
    assert merge_attention_states(o_a, lse_a, o_b, lse_b, out=into) is into
    _close(into, ref, 2e-3)


# ----------------------------------------------------------------------------- cascade_decode end to end
CASES = {  # name -> (groups as (rows, shared pages), rows in no group, page_size)
    "ragged": ([(3, 3), (2, 1), (1, 2)], 1, 16),
    "groups_of_one": ([(1, 2), (1, 1), (1, 3)], 0, 16),
    "page1": ([(3, 21), (1, 5), (2, 11)], 1, 1),
    "no_groups": ([], 3, 16),
}


@pytest.mark.parametrize("case, kv_dtype, splits", [
    ("ragged", "fp32", (2, 1)), ("ragged", "fp8_e4m3", (2, 2)),
    ("groups_of_one", "fp16", (2, 1)), ("groups_of_one", "fp8_e4m3", (1, 2)),
    ("page1", "fp32", (1, 2)), ("page1", "fp8_e4m3", (2, 1)), ("no_groups", "fp16", (None, None)),
])
def test_cascade_decode_equals_paged_decode(case, kv_dtype, splits):
    """cascade_decode (prefix, suffix splits) == paged_decode over the whole page tables, and == its twin."""
    groups, lone, page_size = CASES[case]
    gen = _gen("decode", case, kv_dtype)
    _, q_dt, tol = DTYPES[kv_dtype]
    tables, lens, spec, num_pages = _batch(groups, lone, page_size, gen)
    kc, vc, ks, vs = _caches(num_pages, page_size, 2, 32, kv_dtype, gen)
    q = torch.randn(len(lens), 8, 32, generator=gen).to(q_dt)
    plan = plan_cascade(tables, lens, spec, page_size, "cpu")
    ref = paged_decode(q, kc, vc, _dense_table(tables), torch.tensor(lens, dtype=I32), k_scale=ks, v_scale=vs)
    out = torch.full_like(q, float("nan"))
    assert cascade_decode(q, kc, vc, plan, k_scale=ks, v_scale=vs, prefix_splits=splits[0], suffix_splits=splits[1],
                          out=out) is out
    _close(out, ref, tol)
    _close(cascade_decode_ref(q, kc, vc, plan, k_scale=ks, v_scale=vs), ref, tol)


def test_cascade_decode_rows_with_no_private_tokens():
    """A row whose whole sequence is its group's run (suffix of 0 tokens) still equals paged_decode."""
    gen = _gen("empty-suffix")
    kc, vc, _, _ = _caches(10, 4, 1, 16, "fp32", gen)
    tables = [[1, 2, 3], [1, 2, 5], [7]]
    lens = [8, 10, 3]  # row 0: exactly the 8 shared tokens
    plan = plan_cascade(tables, lens, [([0, 1], 8)], 4, "cpu")
    assert plan.empty_suffix and plan.suffix_lens.tolist() == [0, 2, 3]
    q = torch.randn(3, 2, 16, generator=gen)
    ref = paged_decode(q, kc, vc, _dense_table(tables), torch.tensor(lens, dtype=I32))
    _close(cascade_decode(q, kc, vc, plan), ref, 1e-5)


# ----------------------------------------------------------------------------- two levels
# Rows as (outer run, inner run, own tokens): outer 0 (2 pages) over inner 0 (+2 pages, 3 rows), inner 1 (+1
# page, one row) and two rows in the outer group only (one of them with no own token: its suffix is empty);
# inner 2 (3 pages from page 0) in no outer group; a row in no group at all.
NESTED_OUTER = {0: 2}  # outer run -> pages
NESTED_INNER = {0: (0, 2), 1: (0, 1), 2: (None, 3)}  # inner run -> (its outer run, pages after it)
NESTED_ROWS = [(0, 0, 5), (None, None, 6), (0, 0, 17), (0, None, 7), (None, 2, 4), (0, 0, 1), (0, 1, 3),
               (0, None, 0), (None, 2, 9)]


def _nested_batch(page_size, gen):
    """NESTED_ROWS' page tables (runs and own pages on shuffled pages) -> (tables, lens, groups, outer,
    pages): plan_cascade's inputs for two levels (groups' tokens count from token 0)."""
    own = [-(-n // page_size) for *_, n in NESTED_ROWS]
    need = sum(NESTED_OUTER.values()) + sum(p for _, p in NESTED_INNER.values()) + sum(own)
    perm = torch.randperm(need + 1, generator=gen).tolist()
    outer_run = {o: [perm.pop() for _ in range(n)] for o, n in NESTED_OUTER.items()}
    inner_run = {i: (outer_run[o] if o is not None else []) + [perm.pop() for _ in range(n)]
                 for i, (o, n) in NESTED_INNER.items()}
    tables, lens = [], []
    for (o, i, n), k in zip(NESTED_ROWS, own):
        run = inner_run[i] if i is not None else outer_run.get(o, [])
        tables.append(run + [perm.pop() for _ in range(k)])
        lens.append(len(run) * page_size + n)
    outer = [([b for b, r in enumerate(NESTED_ROWS) if r[0] == o], n * page_size) for o, n in NESTED_OUTER.items()]
    groups = [([b for b, r in enumerate(NESTED_ROWS) if r[1] == i], len(inner_run[i]) * page_size)
              for i in NESTED_INNER]
    return tables, lens, groups, outer, need + 1


@pytest.mark.parametrize("page_size, kv_dtype, splits", [(16, "fp32", (2, 1, 2)), (1, "fp16", (1, 3, 1))])
def test_two_level_cascade_equals_paged_decode(page_size, kv_dtype, splits):
    """Outer + inner prefix states + suffix states, merged == paged_decode over the whole tables (and the
    twin). splits: (outer, inner prefix, suffix)."""
    gen = _gen("two-level", page_size, kv_dtype)
    _, q_dt, tol = DTYPES[kv_dtype]
    tables, lens, groups, outer, num_pages = _nested_batch(page_size, gen)
    kc, vc, _, _ = _caches(num_pages, page_size, 1, 16, kv_dtype, gen)
    q = torch.randn(len(lens), 4, 16, generator=gen).to(q_dt)
    ref = paged_decode(q, kc, vc, _dense_table(tables), torch.tensor(lens, dtype=I32))
    plan = plan_cascade(tables, lens, groups, page_size, "cpu", outer=outer)
    assert plan.empty_suffix and plan.suffix_lens.tolist()[7] == 0
    out = torch.full_like(q, float("nan"))
    assert cascade_decode(q, kc, vc, plan, outer_splits=splits[0], prefix_splits=splits[1],
                          suffix_splits=splits[2], out=out) is out
    _close(out, ref, tol)
    _close(cascade_decode_ref(q, kc, vc, plan), ref, tol)


@pytest.mark.parametrize("case, kv_dtype", [("ragged", "fp8_e4m3"), ("page1", "fp8_e5m2"), ("two_levels", "fp8_e4m3")])
def test_cascade_decode_over_widened_prefix_copies(case, kv_dtype, monkeypatch):
    """FP8 pages and a budget their fp16 copies fit: each level's prefix pages are widened once
    (dequant_pages) and read by the 16-bit prefix kernel; == paged_decode and the in-kernel path. A budget a
    byte short of the copies keeps the in-kernel path."""
    import radixkv.kernels.cascade as cascade_mod
    from radixkv.kernels.dequant_pages import scratch_bytes

    gen = _gen("widened", case, kv_dtype)
    _, q_dt, tol = DTYPES[kv_dtype]
    if case == "two_levels":
        tables, lens, groups, outer, num_pages = _nested_batch(4, gen)
        page_size, hkv, hq, d = 4, 1, 4, 16
    else:
        groups, lone, page_size = CASES[case]
        tables, lens, groups, num_pages = _batch(groups, lone, page_size, gen)
        outer, hkv, hq, d = None, 2, 8, 32
    kc, vc, ks, vs = _caches(num_pages, page_size, hkv, d, kv_dtype, gen)
    q = torch.randn(len(lens), hq, d, generator=gen).to(q_dt)
    plan = plan_cascade(tables, lens, groups, page_size, "cpu", outer=outer)
    levels = [plan.groups] + ([plan.outer] if outer else [])
    need = max(scratch_bytes(lv.prefix_pages, kc, d) for lv in levels)
    widened = []
    monkeypatch.setattr(cascade_mod, "dequant_pages", lambda *a: widened.append(a[4]) or dequant_pages(*a))
    ref = paged_decode(q, kc, vc, _dense_table(tables), torch.tensor(lens, dtype=I32), k_scale=ks, v_scale=vs)
    in_kernel = cascade_decode(q, kc, vc, plan, k_scale=ks, v_scale=vs, widen_max_bytes=need - 1)
    assert len(widened) == (0 if outer is None else 1), "only levels whose copies fit the budget are widened"
    widened.clear()
    out = cascade_decode(q, kc, vc, plan, k_scale=ks, v_scale=vs, widen_max_bytes=need)
    assert len(widened) == len(levels)
    _close(out, ref, tol)
    _close(out, in_kernel, tol)


def test_fp8_prefix_of_head_dim_48_keeps_the_in_kernel_path(monkeypatch):
    """dequant_pages takes power-of-two head dims: at 48 a budget changes nothing (no copies, no error)."""
    import radixkv.kernels.cascade as cascade_mod

    gen = _gen("widened-d48")
    tables, lens, groups, num_pages = _batch([(3, 2), (2, 1)], 1, 16, gen)
    kc, vc, ks, vs = _caches(num_pages, 16, 2, 48, "fp8_e4m3", gen)
    q = torch.randn(len(lens), 4, 48, generator=gen).half()
    plan = plan_cascade(tables, lens, groups, 16, "cpu")
    monkeypatch.setattr(cascade_mod, "dequant_pages", lambda *a: pytest.fail("widened a head_dim of 48"))
    out = cascade_decode(q, kc, vc, plan, k_scale=ks, v_scale=vs, widen_max_bytes=1 << 30)
    _close(out, paged_decode(q, kc, vc, _dense_table(tables), torch.tensor(lens, dtype=I32), k_scale=ks,
                             v_scale=vs), 2e-3)


def test_two_level_plan_layout_and_empty_states():
    """Inner runs start after their rows' outer run; outer-only rows' suffixes start there too; a row in
    no group of a level gets lse -inf at that level (written into a slice of a wider state buffer)."""
    tables = [[4, 5, 9, 1], [4, 5, 9, 2], [4, 5, 7], [6, 3]]
    lens = [14, 15, 10, 6]
    plan = plan_cascade(tables, lens, [([0, 1], 12), ([3], 4)], 4, "cpu", outer=[([0, 1, 2], 8)])
    o, g = plan.outer, plan.groups
    assert o.group_rows.tolist() == [0, 1, 2] and o.prefix_pages.tolist() == [[4, 5]] and o.prefix_lens.tolist() == [8]
    assert g.prefix_pages.tolist() == [[9], [6]] and g.prefix_lens.tolist() == [4, 4]
    assert plan.suffix_pages.tolist() == [[1], [2], [7], [3]] and plan.suffix_lens.tolist() == [2, 3, 2, 2]
    gen = _gen("two-level-empty")
    kc, vc, _, _ = _caches(10, 4, 1, 16, "fp32", gen)
    q = torch.randn(4, 2, 16, generator=gen)
    buf_o, buf_lse = torch.full((4, 2, 3, 16), float("nan")), torch.zeros(4, 2, 3)
    cascade_prefix_attention(q, kc, vc, o.prefix_pages, o.prefix_lens, o.group_start, o.group_rows,
                             out=(buf_o[:, :, 1:], buf_lse[:, :, 1:]))
    assert torch.isinf(buf_lse[3, :, 1:]).all() and torch.isfinite(buf_lse[:3, :, 1]).all()
    assert (buf_lse[:, :, 0] == 0).all(), "out of the slice: untouched"
    ro, rl = cascade_prefix_attention_ref(q, kc, vc, o.prefix_pages, o.prefix_lens, o.group_start, o.group_rows)
    mo, ml = merge_attention_states(buf_o[:, :, 1:], buf_lse[:, :, 1:], buf_o[:, :, :0], buf_lse[:, :, :0],
                                    return_lse=True)
    _states_close(mo, ml, ro[:, :, 0], rl[:, :, 0], 1e-5)
    with pytest.raises(ValueError, match="out's lse must be float32 \\[4, 2, 2\\]"):
        cascade_prefix_attention(q, kc, vc, o.prefix_pages, o.prefix_lens, o.group_start, o.group_rows,
                                 out=(buf_o[:, :, 1:], buf_lse[:, :, :1]))


@pytest.mark.parametrize("groups, outer, match", [
    ([([0, 2], 4)], [([0, 1], 4)], "row 2 of groups\\[0\\] starts at token 0 of the outer level, not 4"),
    ([([0, 1], 4)], [([0, 1], 8)], "the group's 4 tokens end before it"),
    ([([0], 4)], [([0], 4), ([0, 1], 4)], "row 0 is in two groups \\(outer\\[1\\]"),
    ([([0], 4)], [([1, 2], 8)], "row 2 of outer\\[0\\] does not hold"),
])
def test_plan_cascade_rejects_bad_outer_levels(groups, outer, match):
    with pytest.raises(ValueError, match=match):
        plan_cascade([[4, 5, 9], [4, 5, 8], [4, 1]], [10, 11, 5], groups, 4, "cpu", outer=outer)


# ----------------------------------------------------------------------------- layout, rules, checks
def test_plan_cascade_layout():
    tables = [[4, 5, 9], [4, 5, 8, 2], [6]]
    plan = plan_cascade(tables, [10, 13, 3], [([1, 0], 8)], 4, "cpu")
    g = plan.groups
    assert g.group_start.tolist() == [0, 2] and g.group_rows.tolist() == [1, 0]
    assert g.prefix_pages.tolist() == [[4, 5]] and g.prefix_lens.tolist() == [8] and g.max_group_rows == 2
    assert plan.suffix_pages.tolist() == [[9, 0], [8, 2], [6, 0]] and plan.suffix_lens.tolist() == [2, 5, 3]
    assert plan.max_suffix_len == 5 and not plan.empty_suffix
    assert all(t.dtype == I32 for t in (*g[:4], plan.suffix_pages, plan.suffix_lens))


@pytest.mark.parametrize("groups, match", [
    ([([0, 1], 6)], "groups\\[0\\] shares 6 tokens, not a whole number of 4-token pages"),
    ([([0, 2], 4)], "row 2 of groups\\[0\\] does not hold the group's 4 shared tokens"),
    ([([0], 4), ([0, 1], 4)], "row 0 is in two groups"),
    ([([0, 3], 4)], "groups\\[0\\] names row 3 outside the batch of 3"),
    ([([], 4)], "groups\\[0\\] has no rows"),
    ([([1], 16)], "row 1 of groups\\[0\\] does not hold"),  # longer than the row
])
def test_plan_cascade_rejects_bad_groups(groups, match):
    with pytest.raises(ValueError, match=match):
        plan_cascade([[4, 5, 9], [4, 5, 8], [6, 1]], [10, 11, 5], groups, 4, "cpu")


def test_prefix_num_splits_fills_the_gpu():
    # batch 256 x GQA 4 in 128-row tiles x 8 KV heads: 64 programs -> 2 splits, 128 programs on 132 SMs
    assert prefix_num_splits(8, 8, 4096, 132) == 2
    assert prefix_num_splits(2, 8, 4096, 132) == 8  # batch 64: 16 programs -> 128
    assert prefix_num_splits(2, 8, 512, 132) == 2  # short prefixes: >= 256 keys a split
    assert prefix_num_splits(40, 8, 4096, 132) == 1  # enough programs already


def _prefix_inputs():
    gen = _gen("checks")
    kc, vc, _, _ = _caches(6, 4, 1, 16, "fp32", gen)
    q = torch.randn(3, 2, 16, generator=gen)
    return {"q": q, "k_cache": kc, "v_cache": vc, "prefix_pages": torch.tensor([[0, 1], [2, 3]], dtype=I32),
            "prefix_lens": torch.tensor([8, 4], dtype=I32), "group_start": torch.tensor([0, 2, 3], dtype=I32),
            "group_rows": torch.tensor([0, 2, 1], dtype=I32)}


@pytest.mark.parametrize("change, match", [
    ({"prefix_lens": torch.tensor([8, 9], dtype=I32)}, "prefix_lens\\[1\\] = 9 out of range \\[0, 8\\]"),
    ({"prefix_lens": torch.tensor([8], dtype=I32)}, "prefix_lens must have shape \\(2,\\)"),
    ({"prefix_pages": torch.tensor([[0, 1], [6, 3]], dtype=I32)}, "prefix_pages\\[1, 0\\] = 6 out of range"),
    ({"prefix_pages": torch.zeros(2, 2)}, "prefix_pages must be an integer tensor"),
    ({"group_start": torch.tensor([0, 2], dtype=I32)}, "group_start must have shape \\(3,\\)"),
    ({"group_start": torch.tensor([0, 3, 2], dtype=I32)}, "group_start must rise from 0 to len\\(group_rows\\)"),
    ({"group_rows": torch.tensor([0, 2, 3], dtype=I32)}, "group_rows holds row 3 outside q's 3 rows"),
    ({"group_rows": torch.tensor([0, 2, 0], dtype=I32)}, "group_rows holds a row in two groups"),
    ({"q": torch.randn(3, 2, 8)}, "q \\(3, 2, 8\\) does not fit caches"),
    ({"k_scale": torch.ones(6, 4, 1)}, "scales given for a non-FP8 cache"),
    ({"sm_scale": -1.0}, "sm_scale must be positive"),
    ({"num_splits": 0}, "num_splits must be >= 1"),
    ({"max_group_rows": 1}, "max_group_rows = 1 is below the largest group's rows"),
])
def test_prefix_argument_checks(change, match):
    kw = {**_prefix_inputs(), **change}
    with pytest.raises(ValueError, match="cascade_prefix_attention: " + match):
        cascade_prefix_attention(**kw)


def test_other_argument_checks():
    kw = _prefix_inputs()
    q, kc, vc = kw["q"], kw["k_cache"], kw["v_cache"]
    o = torch.zeros(3, 2, 1, 16)
    lse = torch.zeros(3, 2, 1)
    with pytest.raises(ValueError, match="merge_attention_states: lse_a shape \\(3, 2, 2\\) does not match"):
        merge_attention_states(o, torch.zeros(3, 2, 2), o, lse)
    with pytest.raises(ValueError, match="merge_attention_states: lse_b dtype torch.float16 not supported"):
        merge_attention_states(o, lse, o, lse.half())
    with pytest.raises(ValueError, match="merge_attention_states: o_b \\(3, 4, 1, 16\\) does not match o_a"):
        merge_attention_states(o, lse, torch.zeros(3, 4, 1, 16), torch.zeros(3, 4, 1))
    with pytest.raises(ValueError, match="merge_attention_states: o_a must be a \\[B, Hq, D\\] or"):
        merge_attention_states(torch.zeros(3, 16), lse, o, lse)
    with pytest.raises(ValueError, match="paged_decode_partial: q has 3 rows, page_table 2"):
        paged_decode_partial(q, kc, vc, torch.zeros(2, 1, dtype=I32), torch.ones(2, dtype=I32))
    with pytest.raises(IndexValueError, match="paged_decode_partial: seq_lens\\[0\\] = -1"):
        paged_decode_partial(q, kc, vc, torch.zeros(3, 1, dtype=I32), torch.tensor([-1, 1, 1], dtype=I32))
    with pytest.raises(ValueError, match="cascade_decode: plan must be a CascadePlan"):
        cascade_decode(q, kc, vc, "plan")
    plan = plan_cascade([[0], [1], [2]], [2, 2, 2], [], 4, "cpu")
    assert isinstance(plan, CascadePlan)
    with pytest.raises(ValueError, match="cascade_decode: q \\(3, 2, 8\\) does not fit"):
        cascade_decode(torch.randn(3, 2, 8), kc, vc, plan)


# ----------------------------------------------------------------------------- the GPU build
_COMPILE = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import radixkv.kernels.cascade as m
import radixkv.kernels.cascade_plan as plan

def build(kv, cfg):
    fn = m._prefix_kernel
    types = {a: "i32" for a in fn.arg_names}
    types.update(q_ptr="*bf16", kc_ptr="*" + kv, vc_ptr="*" + kv, ks_ptr="*fp16", vs_ptr="*fp16", pt_ptr="*i32",
                 plen_ptr="*i32", gstart_ptr="*i32", grows_ptr="*i32", o_ptr="*fp32", lse_ptr="*fp32",
                 qk_scale="fp32")
    consts = dict(GROUP=4, HEAD_DIM=128, PAGE_SIZE=16, BLOCK_M=cfg.block_m, BLOCK_D=128, BLOCK_N=cfg.block_n,
                  IS_FP8=kv.startswith("fp8"), OP_FP16=kv == "fp16", DOT_PRECISION="tf32", stride_qd=1, stride_cd=1,
                  stride_od=1, stride_ls=1)
    types.update({c: "constexpr" for c in consts})
    return triton.compile(ASTSource(fn, types, consts, {}), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})

bf16 = build("bf16", plan.PREFIX_GPU)  # checked for wgmma only; k (FP8, the heavier tile) for its resources too
wide = build("fp16", plan.PREFIX_GPU)  # FP8 prefixes widened to fp16 copies, under bf16 q: fp16 products
k = build("fp8e4nv", plan.PREFIX_FP8_GPU)
assert all("wgmma" in x.asm["ptx"] for x in (bf16, wide, k)), "the shared-prefix products must run on wgmma"
assert ".f32.f16.f16" in wide.asm["ptx"], "the widened copies multiply as fp16"
"""


def test_prefix_kernel_compiles_for_sm90():
    """The interpreter cannot show GPU-only failures: the default GPU tiles over bf16, FP8 and widened fp16
    pages under bf16 q (Llama-8B heads, page 16) must compile for sm_90 onto wgmma (fp16 operands for the
    widened copies), the FP8 one without spilling (Triton 3.9's
    ptxas; the H200's 3.6 differs)."""
    from sm90_compile import compile_sm90

    res = compile_sm90(_COMPILE, {})
    assert res["regs"] <= 255 and res["stack"] <= 32, res
