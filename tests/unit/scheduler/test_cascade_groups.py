"""Cascade groups (radixkv/scheduler/cascade_groups.py): hand-made page tables, the worth-it rule, the
Scheduler flag end to end over a real RadixCache, and a Hypothesis property over random batches."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixkv import PagePool, RadixCache, SchedulerConfig
from radixkv.request import Request
from radixkv.batch import CascadeLevels
from radixkv.scheduler.cascade_groups import (
    CASCADE_MIN_ROWS_16BIT,
    CASCADE_MIN_SHARED_TOKENS_16BIT,
    CASCADE_OUTER_MIN_SHARED_TOKENS,
    CASCADE_OUTER_MIN_UNITS,
    OUTER_RULE,
    RULE_16BIT,
    RULE_ALWAYS,
    RULE_FP8,
    RULE_FP8_IN_KERNEL,
    RULE_NEVER,
    CascadeRule,
    cascade_levels,
    find_cascade_groups,
    outer_level_pays,
    rule_for,
)
from radixkv.scheduler.scheduler import Scheduler

PS = 4


def find(tables, rule=RULE_ALWAYS, **kw) -> CascadeLevels | None:
    """Decode rows whose whole tables are computed but the last token (q_len 1 at the end)."""
    seq = [len(t) * PS for t in tables]
    return find_cascade_groups(tables, seq, PS, rule=rule, **kw)


def groups(level) -> list[tuple[tuple[int, ...], int, tuple[int, ...]]]:
    return sorted((g.rows, g.page_start, g.pages) for g in level)


def check_levels(c: CascadeLevels, tables, seq_lens, q_lens=None) -> None:
    """The layout contract: runs are the rows' own pages, a row in <= 1 group a level, runs consecutive."""
    B = len(tables)
    ql = q_lens or [1] * B
    end = [0] * B
    for level in c.levels:
        seen: set[int] = set()
        for g in level:
            assert len(g.rows) >= 2 and len(g.pages) >= 1
            assert list(g.rows) == sorted(g.rows)
            for r in g.rows:
                assert r not in seen, f"row {r} in two groups of a level"
                seen.add(r)
                assert g.page_start == end[r]
                assert tuple(tables[r][g.page_start: g.page_end]) == g.pages
                assert g.page_end * PS <= seq_lens[r] - ql[r]  # only pages computed before this step
                end[r] = g.page_end
    assert list(c.suffix_start) == end
    seen = set()
    for g in c.one_level:
        assert g.page_start == 0 and tuple(tables[g.rows[0]][: len(g.pages)]) == g.pages
        for r in g.rows:
            assert r not in seen and tuple(tables[r][: len(g.pages)]) == g.pages
            seen.add(r)


# ---- hand-made page tables ---------------------------------------------------------------------------
def test_no_sharing_and_groups_of_one() -> None:
    assert find([[1, 2], [3, 4], [5, 6]]) is None
    assert find([[1, 2, 3]]) is None  # one row
    assert find([]) is None
    c = find([[1, 2, 9], [1, 2, 8], [5, 6, 7]])  # row 2 alone: in no group
    assert groups(c.levels[0]) == [((0, 1), 0, (1, 2))]
    assert c.suffix_start == (2, 2, 0)


def test_shared_runs_of_different_depths() -> None:
    tables = [[1, 2, 3, 4, 10], [1, 2, 3, 4, 11], [20, 21, 30], [20, 21, 31], [20, 21, 32], [40]]
    c = find(tables)
    assert c.num_levels == 1
    assert groups(c.levels[0]) == [((0, 1), 0, (1, 2, 3, 4)), ((2, 3, 4), 0, (20, 21))]
    assert c.suffix_start == (4, 4, 2, 2, 2, 0)
    assert c.plan_groups() == [([0, 1], 16), ([2, 3, 4], 8)]
    assert c.pages_saved == 4 + 2 * 2
    check_levels(c, tables, [len(t) * PS for t in tables])


def test_ragged_tables_and_partial_last_page() -> None:
    # row 1 ends inside the shared run's last page: only its full pages before the new token can be shared
    tables = [[1, 2, 3, 7], [1, 2, 3], [1, 2, 3, 4, 5, 6]]
    seq = [16, 10, 24]  # row 1: tokens 0..9, the new one at position 9 (page index 2, partial)
    c = find_cascade_groups(tables, seq, PS, rule=RULE_ALWAYS)
    check_levels(c, tables, seq)
    # row 1 shares pages 1, 2 (8 tokens); rows 0 and 2 also share page 3 -> two levels
    assert groups(c.one_level) in ([((0, 2), 0, (1, 2, 3))], [((0, 1, 2), 0, (1, 2))])
    assert c.levels[0] == (c.levels[0][0],) and c.levels[0][0].pages[:2] == (1, 2)


def test_only_decode_rows_by_default_and_explicit_rows() -> None:
    tables = [[1, 2, 3], [1, 2, 4], [1, 2, 5, 6, 7]]
    seq = [12, 12, 20]
    q = [1, 1, 9]  # row 2 is a prefill chunk
    c = find_cascade_groups(tables, seq, PS, rule=RULE_ALWAYS, q_lens=q)
    assert groups(c.levels[0]) == [((0, 1), 0, (1, 2))]
    c = find_cascade_groups(tables, seq, PS, rule=RULE_ALWAYS, q_lens=q, rows=[0, 2])
    assert groups(c.levels[0]) == [((0, 2), 0, (1, 2))]  # row 2: tokens 0..10 computed before, pages 1, 2 full
    with pytest.raises(ValueError, match="rows must lie"):
        find_cascade_groups(tables, seq, PS, rows=[3])
    with pytest.raises(ValueError, match="seq_lens"):
        find_cascade_groups(tables, seq[:2], PS)
    with pytest.raises(ValueError, match="max_levels"):
        find_cascade_groups(tables, seq, PS, max_levels=3)


def test_two_levels_system_prompt_over_few_shot_blocks() -> None:
    sys_p, a, b = [1, 2], [10, 11, 12, 13], [20, 21, 22, 23]
    tables = [sys_p + a + [100], sys_p + a + [101], sys_p + b + [102], sys_p + b + [103], sys_p + [104, 105]]
    c = find(tables)
    check_levels(c, tables, [len(t) * PS for t in tables])
    assert c.num_levels == 2
    assert groups(c.levels[0]) == [((0, 1, 2, 3, 4), 0, (1, 2))]
    assert groups(c.levels[1]) == [((0, 1), 2, tuple(a)), ((2, 3), 2, tuple(b))]
    assert c.suffix_start == (6, 6, 6, 6, 2)
    assert groups(c.one_level) == [((0, 1), 0, (1, 2, *a)), ((2, 3), 0, (1, 2, *b))]
    assert c.pages_saved == 4 * 2 + 4 + 4
    one = find(tables, max_levels=1)
    assert one.num_levels == 1 and one.levels[0] == one.one_level == c.one_level
    assert one.suffix_start == (6, 6, 6, 6, 0)


def test_outer_level_units_plan_and_rule() -> None:
    """outer_units counts inner groups and lone rows under an outer group; plan_outer / plan_groups are
    plan_cascade's two levels; outer_level_pays asks the rule about (units, outer tokens)."""
    sys_p, a, b = [1, 2], [10, 11, 12, 13], [20, 21, 22, 23]
    tables = [sys_p + a + [100], sys_p + a + [101], sys_p + b + [102], sys_p + b + [103], sys_p + [104, 105]]
    c = find(tables)
    assert c.outer_units() == (3,)  # groups a, b and row 4
    assert c.plan_outer() == [([0, 1, 2, 3, 4], 2 * PS)]
    assert c.plan_groups() == [([0, 1], 6 * PS), ([2, 3], 6 * PS)]
    assert outer_level_pays(c, RULE_ALWAYS) and outer_level_pays(c, CascadeRule(((3, 8),)))
    assert not outer_level_pays(c, CascadeRule(((4, 8),))) and not outer_level_pays(c, CascadeRule(((3, 12),)))
    assert not outer_level_pays(c)  # OUTER_RULE: 3 units over 8 tokens is far below it
    one = find(tables, max_levels=1)
    assert one.outer_units() == () and one.plan_outer() == [] and not outer_level_pays(one, RULE_ALWAYS)
    assert not outer_level_pays(None)
    assert OUTER_RULE.worth_it(CASCADE_OUTER_MIN_UNITS, CASCADE_OUTER_MIN_SHARED_TOKENS)
    assert not OUTER_RULE.worth_it(CASCADE_OUTER_MIN_UNITS - 1, 1 << 20)


def test_shallow_group_wins_when_the_deep_ones_save_less() -> None:
    # 4 rows share 4 pages; two pairs share one more page: one level of all 4 saves 3 x 4 = 12 > 2 x 5
    tables = [[1, 2, 3, 4, 5, 90], [1, 2, 3, 4, 5, 91], [1, 2, 3, 4, 6, 92], [1, 2, 3, 4, 6, 93]]
    c = find(tables)
    assert groups(c.one_level) == [((0, 1, 2, 3), 0, (1, 2, 3, 4))]
    # the outer level over the pairs is offered then: but the pairs are already inside the chosen group
    check_levels(c, tables, [len(t) * PS for t in tables])


def test_rule_thresholds_and_dtypes() -> None:
    assert RULE_16BIT.worth_it(CASCADE_MIN_ROWS_16BIT, CASCADE_MIN_SHARED_TOKENS_16BIT)
    assert not RULE_16BIT.worth_it(CASCADE_MIN_ROWS_16BIT - 1, 1 << 20)
    assert not RULE_16BIT.worth_it(1 << 10, CASCADE_MIN_SHARED_TOKENS_16BIT - 1)
    assert RULE_16BIT.worth_it(256, 4096)
    # FP8 (its prefixes over fp16 copies): 64 x 1k loses, 64 x 2k wins (RESULTS.md); dequantised in-kernel (a
    # head_dim not a power of two): 64 x 1k loses, 64 x 4k and 256 x 1k win
    assert RULE_FP8.worth_it(64, 2048) and RULE_FP8.worth_it(256, 1024)
    assert not RULE_FP8.worth_it(64, 2047) and not RULE_FP8.worth_it(63, 4096) and not RULE_FP8.worth_it(255, 1024)
    assert not RULE_FP8_IN_KERNEL.worth_it(64, 1024)
    assert RULE_FP8_IN_KERNEL.worth_it(64, 4096) and RULE_FP8_IN_KERNEL.worth_it(256, 1024)
    assert rule_for("fp8_e4m3", 96) is RULE_FP8_IN_KERNEL and rule_for("fp8_e4m3", 128) is RULE_FP8
    assert not RULE_NEVER.worth_it(1 << 12, 1 << 20)
    assert not RULE_ALWAYS.worth_it(1, 100) and RULE_ALWAYS.worth_it(2, 1)
    for name in ("bf16", "fp16", "fp32", "bfloat16", "auto"):
        assert rule_for(name) is RULE_16BIT
    for name in ("fp8", "fp8_e4m3", "fp8_e5m2"):
        assert rule_for(name) is RULE_FP8
    assert rule_for("int4") is RULE_NEVER and rule_for("int2") is RULE_NEVER
    with pytest.raises(ValueError):
        rule_for("int8")


def test_rule_filters_small_groups() -> None:
    shared = list(range(1000, 1000 + 1024 // PS))  # 1k tokens
    big = [shared + [5000 + i] for i in range(64)]
    small = [[7, 8, 9] + [6000 + i] for i in range(10)]
    tables = big + small
    c = find(tables, rule=RULE_16BIT)
    assert groups(c.levels[0]) == [(tuple(range(64)), 0, tuple(shared))]
    assert find(big[:63], rule=RULE_16BIT) is None
    rule = CascadeRule(((2, 12),))
    c = find(tables, rule=rule)
    assert groups(c.levels[0]) == [(tuple(range(64)), 0, tuple(shared)), (tuple(range(64, 74)), 0, (7, 8, 9))]


# ---- end to end: a real RadixCache + Scheduler ---------------------------------------------------------
def _drive(s: Scheduler, reqs: list[Request], on_batch) -> None:
    for r in reqs:
        s.add(r, 0.0)
    now = 0.0
    while s.has_work():
        batch = s.schedule(now)
        assert batch is not None
        batch.check()
        on_batch(batch)
        s.update(batch, [1000 + b for b in range(len(batch.requests))], now)
        now += 1.0


def test_scheduler_flag_off_builds_nothing() -> None:
    pool = PagePool(128)
    s = Scheduler(pool, RadixCache(pool, page_size=PS), SchedulerConfig(), PS, cascade_rule=RULE_ALWAYS)
    prefix = list(range(40))
    seen = []
    _drive(s, [Request(i, prefix + [500 + i], max_tokens=4) for i in range(4)],
           lambda b: seen.append(b.cascade))
    assert seen and all(c is None for c in seen)


def test_few_shot_groups_match_the_tree_pages() -> None:
    pool = PagePool(256)
    cache = RadixCache(pool, page_size=PS)
    s = Scheduler(pool, cache, SchedulerConfig(cascade=True), PS, cascade_rule=RULE_ALWAYS)
    system = list(range(1, 9))  # 2 pages
    shots = {"a": list(range(100, 124)), "b": list(range(200, 216))}  # 6 and 4 pages
    # warm the tree with each few-shot prompt, then several questions over each
    _drive(s, [Request(0, system + shots["a"] + [7], 1), Request(1, system + shots["b"] + [7], 1)], lambda b: None)
    m = {k: cache.match(system + v) for k, v in shots.items()}
    assert m["a"].num_tokens == 32 and m["b"].num_tokens == 24
    reqs = [Request(10 + i, system + shots["ab"[i % 2]] + [300 + i, 301, 302], max_tokens=6) for i in range(6)]
    decode_steps = 0

    def on_batch(batch) -> None:
        nonlocal decode_steps
        c = batch.cascade
        rid_shot = {r.rid: "ab"[(r.rid - 10) % 2] for r in batch.requests}
        if not batch.is_decode_only or len(batch.requests) < 6:
            return
        decode_steps += 1
        assert c is not None
        check_levels(c, batch.page_tables, batch.seq_lens, batch.q_lens)
        assert c.num_levels == 2
        assert groups(c.levels[0]) == [(tuple(range(6)), 0, tuple(m["a"].pages[:2]))]
        for g in c.levels[1]:
            shot = {rid_shot[batch.requests[r].rid] for r in g.rows}
            assert len(shot) == 1
            k = shot.pop()
            assert g.rows == tuple(b for b, r in enumerate(batch.requests) if rid_shot[r.rid] == k)
            assert g.page_start == 2 and g.pages == tuple(m[k].pages[2:])
        for g in c.one_level:  # plan_cascade's single level: the whole few-shot prompt from page 0
            k = rid_shot[batch.requests[g.rows[0]].rid]
            assert g.pages == tuple(m[k].pages) and len(g.rows) == 3

    _drive(s, reqs, on_batch)
    assert decode_steps >= 3
    cache.check_invariants()


def test_cascade_levels_of_a_batch() -> None:
    pool = PagePool(64)
    s = Scheduler(pool, RadixCache(pool, page_size=PS), SchedulerConfig(cascade=True), PS)  # 16-bit rule
    prefix = list(range(40))
    out = []
    _drive(s, [Request(0, prefix + [1], 1)], lambda b: None)
    _drive(s, [Request(i, prefix + [500 + i], max_tokens=3) for i in range(1, 4)],
           lambda b: out.append((b.cascade, cascade_levels(b, rule=RULE_ALWAYS), cascade_levels(b, "int4"))))
    assert all(c is None for c, _, _ in out)  # 3 rows x 40 tokens: not worth it on the measured rule
    assert any(a is not None and len(a.levels[0][0].rows) == 3 for _, a, _ in out)
    assert all(n is None for _, _, n in out)


# ---- property: random batches ---------------------------------------------------------------------------
@st.composite
def batches(draw):
    """Rows drawn as paths down a small random tree of shared page runs, then private pages."""
    next_page = iter(range(1, 1 << 30))
    runs = {(): []}
    nodes = [()]
    for _ in range(draw(st.integers(0, 8))):
        parent = draw(st.sampled_from(nodes))
        key = (*parent, len(nodes))
        runs[key] = runs[parent] + [next(next_page) for _ in range(draw(st.integers(1, 4)))]
        nodes.append(key)
    tables, seq, q = [], [], []
    for _ in range(draw(st.integers(0, 12))):
        pages = runs[draw(st.sampled_from(nodes))] + [next(next_page) for _ in range(draw(st.integers(0, 3)))]
        if not pages:
            pages = [next(next_page)]
        n = draw(st.integers((len(pages) - 1) * PS + 1, len(pages) * PS))
        tables.append(pages)
        seq.append(n)
        q.append(draw(st.sampled_from([1, 1, 1, 2])) if n > 2 else 1)
    return tables, seq, q


@settings(max_examples=300, deadline=None)
@given(batches(), st.sampled_from([1, 2]), st.sampled_from([RULE_ALWAYS, CascadeRule(((3, 8),))]))
def test_property_groups_are_common_prefixes(batch, max_levels, rule) -> None:
    tables, seq, q = batch
    c = find_cascade_groups(tables, seq, PS, rule=rule, q_lens=q, max_levels=max_levels)
    if c is None:
        return
    check_levels(c, tables, seq, q)
    assert c.num_levels <= max_levels
    decode = {b for b in range(len(tables)) if q[b] == 1}
    for level in c.levels:
        for g in level:
            assert set(g.rows) <= decode
    for g in c.one_level:  # each one-level group is maximal: no row outside it holds its whole run
        assert rule.worth_it(len(g.rows), g.tokens(PS))
        for b in decode - set(g.rows):
            assert tuple(tables[b][: len(g.pages)]) != g.pages or (seq[b] - 1) // PS < len(g.pages)


def test_rule_floor_bounds_every_group_it_takes() -> None:
    """CascadeRule.floor: what DecodeGraphs.warm_cascade warms for (the fewest rows and shared tokens)."""
    from radixkv.scheduler.cascade_groups import RULE_ALWAYS, RULE_FP8, RULE_NEVER

    assert RULE_16BIT.floor == (64, 1024) and RULE_FP8.floor == (64, 1024) and RULE_ALWAYS.floor == (2, 1)
    assert RULE_NEVER.floor is None
