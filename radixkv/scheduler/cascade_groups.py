"""Cascade groups: which decode rows of a step share a run of cached pages, read once per group. No torch.

Rows that share a prefix through the radix tree hold the tree's pages for it, so their page tables
start with the same physical page ids; private pages (the tail, the page a decode token is written
to) belong to one row only. The longest common leading run of page ids is therefore exact: no tree
walk is needed. `find_cascade_groups` builds the trie of the rows' page tables (compressed: a node
per branching point, found by partitioning rows on the page where they part) in
O(total pages of the rows) list comparisons, and picks

- level one (always): an antichain of trie nodes, each a group of rows and the pages they all share
  from page 0, maximising the KV pages not re-read, sum over groups of (rows - 1) x pages, among the
  groups the rule (`CascadeRule`) finds worth it. This is the one level `kernels.cascade_plan.plan_cascade`
  takes (`CascadeLevels.plan_groups`).
- an outer level (max_levels=2), when it pays: a shallower node above several chosen groups (a
  system prompt shared by all rows over a few-shot block shared by some). Its group reads the run
  [0, depth) once; the groups under it then start at its end (`CascadeGroup.page_start`), and its
  rows in no inner group attend from there as their own pages. The engine runs it only when
  `outer_level_pays` (OUTER_RULE: one more launch a layer against the reads it saves); else one level.

Layout: `CascadeLevels.levels` lists levels outermost first. A row is in at most one group a level;
the runs of a row's groups follow each other (a group's page_start is where the row's group of the
previous level ends, 0 when it has none) and `suffix_start[b]` is where row b's own pages begin.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from radixkv.batch import CascadeGroup, CascadeLevels
from radixkv.config import KVDtype, canonical_kv_dtype_name

# When a group is worth it, from benchmarks/RESULTS.md "Cascade decode kernels (issue 21 item 2)", H200,
# Llama-8B heads, page 16, one group holding every row: attention us plain vs cascade.
# 16-bit pages: every measured shape wins; the smallest, 64 rows x 1k shared, by 1.18-1.42x (256 x 1k:
# 1.63-2.82x; 4k and 16k: 2.3-8.6x). Nothing below 64 rows or 1k tokens was measured, so that is the floor.
CASCADE_MIN_ROWS_16BIT = 64
CASCADE_MIN_SHARED_TOKENS_16BIT = 1024
# FP8 pages: the prefix kernel reads fp16 copies of a group's prefix, widened once a layer (kernels/cascade.py).
# Over the copies (RESULTS.md "FP8 cascades at 64 rows", 2026-12-03): 64 rows x 1k still LOSES to the Gluon FP8
# plain decode (0.92x with 64 own tokens, 0.87x with 256: the widening pass and the merge cost more than the
# reads saved), 64 x 2k wins 1.24-1.27x, 64 x 4k 1.65-1.77x, 128 x 2k 1.52-1.85x; 256 x 1k wins 1.41-1.63x (results/cascade_short.json).
# That holds where prefixes can be widened (a power-of-two head_dim: dequant_pages' rows).
CASCADE_FP8 = ((64, 2048), (256, 1024))
# Prefixes dequantised in-kernel (other head_dims): 64 rows x 1k LOSES to the Gluon FP8 plain decode
# (0.75-0.80x); 64 x 4k wins 1.24-1.37x, 64 x 16k 1.63-1.73x, and 256 rows win from 1k on (1.12-1.23x).
CASCADE_IN_KERNEL_FP8 = ((64, 4096), (256, 1024))


# When an outer level (max_levels=2) is worth it. It costs one more shared-prefix launch a layer (the kernels
# merge every level's states in the one merge) and saves (units - 1) x its pages of reads, units = the
# inner groups and the rows in none under it (on one level each reads the outer run once). Measured
# (benchmarks/kernels/bench_cascade_levels.py, H200, bf16, Llama-8B heads, 256 rows, one layer's attention;
# benchmarks/RESULTS.md "Two cascade levels"): two levels over one = 0.87-0.93x with 4 inner groups (1k or
# 4k outer), 1.01-1.02x with 16 under a 1k outer run, 1.17-1.29x with 16 under a 4k one.
CASCADE_OUTER_MIN_UNITS = 16
CASCADE_OUTER_MIN_SHARED_TOKENS = 4096


@dataclass(frozen=True)
class CascadeRule:
    """A group of `rows` rows sharing `tokens` tokens is worth a cascade launch when it meets any one of
    the (min_rows, min_shared_tokens) pairs; no pair: never (groups are always at least 2 rows).
    OUTER_RULE reads the pairs as (min_units, min_shared_tokens) of an outer group (outer_level_pays)."""

    thresholds: tuple[tuple[int, int], ...]

    def worth_it(self, rows: int, tokens: int) -> bool:
        return rows >= 2 and tokens > 0 and any(rows >= r and tokens >= t for r, t in self.thresholds)

    @property
    def floor(self) -> tuple[int, int] | None:
        """(fewest rows, fewest shared tokens) any group it takes has (over the pairs: a bound, not a
        pair it takes); None when it takes none."""
        if not self.thresholds:
            return None
        return max(2, min(r for r, _ in self.thresholds)), max(1, min(t for _, t in self.thresholds))


RULE_16BIT = CascadeRule(((CASCADE_MIN_ROWS_16BIT, CASCADE_MIN_SHARED_TOKENS_16BIT),))
RULE_FP8 = CascadeRule(CASCADE_FP8)
RULE_FP8_IN_KERNEL = CascadeRule(CASCADE_IN_KERNEL_FP8)
RULE_NEVER = CascadeRule(())
RULE_ALWAYS = CascadeRule(((2, 1),))  # any shared page of any 2 rows (tests, experiments)
OUTER_RULE = CascadeRule(((CASCADE_OUTER_MIN_UNITS, CASCADE_OUTER_MIN_SHARED_TOKENS),))


def rule_for(kv_dtype: object, head_dim: int | None = None) -> CascadeRule:
    """The rule of a KV dtype (a KVDtype, its name or an alias). fp32 takes the 16-bit rule (not measured:
    it reads twice the bytes a token, so the cascade saves at least as much); INT4/INT2 never (the cascade
    kernels do not read integer pages yet); 'auto' (the compute dtype: 16 or 32 bits) the 16-bit rule; FP8
    RULE_FP8, or RULE_FP8_IN_KERNEL for a head_dim whose prefixes are not widened (not a power of two)."""
    if canonical_kv_dtype_name(kv_dtype) == "auto":
        return RULE_16BIT
    kv = KVDtype.parse(kv_dtype)
    if kv.is_int:
        return RULE_NEVER
    if not kv.is_fp8:
        return RULE_16BIT
    return RULE_FP8_IN_KERNEL if head_dim is not None and head_dim & (head_dim - 1) else RULE_FP8


def outer_level_pays(levels: CascadeLevels | None, rule: CascadeRule = OUTER_RULE) -> bool:
    """Whether a step runs its two levels rather than one: it has an outer level and some outer group of
    `units` units (CascadeLevels.outer_units) sharing `tokens` tokens passes rule.worth_it(units, tokens).
    One group passing pays for the level's launch; the other outer groups then only save reads."""
    if levels is None or levels.num_levels < 2:
        return False
    return any(rule.worth_it(n, g.tokens(levels.page_size)) for n, g in zip(levels.outer_units(), levels.levels[0]))


class _Node:
    __slots__ = ("below", "best", "children", "chosen", "depth", "outer", "rows", "start", "units")

    def __init__(self, rows: list[int], start: int, depth: int) -> None:
        self.rows = rows  # batch rows under this node (>= 2), ascending
        self.start = start  # depth of the parent node: rows part there
        self.depth = depth  # pages every row here shares with the others (their LCP)
        self.children: list[_Node] = []
        self.best = 0  # the DPs' best saving in this subtree
        self.chosen = False  # a group of level one
        self.outer = False  # a group of the outer level
        self.units = 0
        self.below: list[_Node] = []  # level-one groups under this node


def _common(a: Sequence[int], b: Sequence[int], lo: int, hi: int) -> int:
    """The largest k in [lo, hi] with a[lo:k] == b[lo:k] (a[:lo] == b[:lo] given)."""
    if hi <= lo or a[lo:hi] == b[lo:hi]:
        return hi
    if a[lo] != b[lo]:
        return lo
    good, bad = lo + 1, hi  # a[lo:good] equal, a[lo:bad] not
    while bad - good > 1:
        mid = (good + bad) // 2
        if a[good:mid] == b[good:mid]:
            good = mid
        else:
            bad = mid
    return good


def _build(page_tables: Sequence[Sequence[int]], cap: list[int], rows: list[int]) -> list[_Node]:
    """Trie nodes (>= 2 rows sharing >= 1 page) of the given rows, top-level nodes returned. Each row's
    pages are compared once per node on its path, over disjoint page ranges: O(total pages)."""
    tops: list[_Node] = []
    todo: list[tuple[list[int], int, _Node | None]] = [(rows, 0, None)]  # rows sharing pages[:start]
    while todo:
        rs, start, parent = todo.pop()
        buckets: dict[int, list[int]] = {}
        for r in rs:
            if cap[r] > start:
                buckets.setdefault(page_tables[r][start], []).append(r)
        for bucket in buckets.values():
            if len(bucket) < 2:
                continue
            first = page_tables[bucket[0]]
            end = min(cap[r] for r in bucket)
            for r in bucket[1:]:
                end = _common(first, page_tables[r], start + 1, end)
            node = _Node(bucket, start, end)
            (parent.children if parent is not None else tops).append(node)
            todo.append((bucket, end, node))
    return tops


def _postorder(tops: list[_Node]) -> list[_Node]:
    out: list[_Node] = []
    stack = list(tops)
    while stack:
        v = stack.pop()
        out.append(v)
        stack.extend(v.children)
    out.reverse()  # children before parents
    return out


def _group(v: _Node, page_tables: Sequence[Sequence[int]], start: int) -> CascadeGroup:
    return CascadeGroup(tuple(v.rows), start, tuple(page_tables[v.rows[0]][start: v.depth]))


def find_cascade_groups(page_tables: Sequence[Sequence[int]], seq_lens: Sequence[int], page_size: int, *,
                        rule: CascadeRule = RULE_16BIT, q_lens: Sequence[int] | None = None,
                        rows: Sequence[int] | None = None, max_levels: int = 2) -> CascadeLevels | None:
    """The cascade levels of a step, or None when no group is worth it (plain decode).

    page_tables[b], seq_lens[b]: row b's pages and its tokens once this step has run (Batch's fields);
    q_lens[b] (default 1): its new tokens this step, whose pages are never shared (only pages holding
    tokens before them are); rows: the candidate rows (default: every row with q_len 1, the decode rows).
    Groups have >= 2 rows and are chosen by `rule`; max_levels 1 or 2 (module docstring)."""
    if max_levels not in (1, 2):
        raise ValueError(f"max_levels must be 1 or 2, got {max_levels}")
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    B = len(page_tables)
    if len(seq_lens) != B or (q_lens is not None and len(q_lens) != B):
        raise ValueError(f"{B} page tables but {len(seq_lens)} seq_lens"
                         + (f" and {len(q_lens)} q_lens" if q_lens is not None else ""))
    ql = q_lens if q_lens is not None else [1] * B
    if rows is None:
        rows = [b for b in range(B) if ql[b] == 1]
    else:
        rows = sorted({int(r) for r in rows})
        if rows and not (0 <= rows[0] and rows[-1] < B):
            raise ValueError(f"rows must lie in [0, {B})")
    cap = [min(len(page_tables[b]), max(seq_lens[b] - ql[b], 0) // page_size) for b in range(B)]
    firsts = [page_tables[b][0] for b in rows if cap[b]]
    if len(set(firsts)) == len(firsts):  # no two rows share their first page: no group (O(B), the common case)
        return None
    order = _postorder(_build(page_tables, cap, list(rows)))
    if not order:
        return None

    # Level one: best(v) = max(own saving if worth it, sum of the children's best); ties keep v (fewer groups).
    for v in order:
        n = len(v.rows)
        kids = sum(c.best for c in v.children)
        own = (n - 1) * v.depth if rule.worth_it(n, v.depth * page_size) else -1
        v.chosen = own >= kids and own > 0
        v.best = own if v.chosen else kids
    inner: list[_Node] = []
    stack = [v for v in order if v.start == 0]
    while stack:
        v = stack.pop()
        if v.chosen:
            inner.append(v)
        else:
            stack.extend(v.children)
    if not inner:
        return None
    inner.sort(key=lambda v: v.rows[0])

    # Outer level: over nodes above the chosen ones, units(v) = chosen groups + lone rows under v; a node
    # pays (units - 1) x depth, when the rule takes it and every chosen group under it stays worth it.
    outer: list[_Node] = []
    if max_levels == 2:
        for v in order:
            v.below = []
            if v.chosen:
                v.units, v.best = 1, 0
                continue
            in_kids = sum(len(c.rows) for c in v.children)
            v.units = len(v.rows) - in_kids + sum(c.units for c in v.children)
            for c in v.children:
                v.below.extend([c] if c.chosen else c.below)
            kids = sum(c.best for c in v.children if not c.chosen)
            own = -1
            if (v.below and v.units >= 2 and rule.worth_it(len(v.rows), v.depth * page_size)
                    and all(rule.worth_it(len(g.rows), (g.depth - v.depth) * page_size) for g in v.below)):
                own = (v.units - 1) * v.depth
            v.best = own if own >= kids and own > 0 else kids
            v.outer = own >= kids and own > 0
        stack = [v for v in order if v.start == 0]
        while stack:
            v = stack.pop()
            if v.chosen:
                continue
            if v.outer:
                outer.append(v)
            else:
                stack.extend(v.children)
        outer.sort(key=lambda v: v.rows[0])

    suffix = [0] * B
    starts: dict[int, int] = {}  # id(inner node) -> its page_start
    for u in outer:
        for r in u.rows:
            suffix[r] = u.depth
        for g in u.below:
            starts[id(g)] = u.depth
    for g in inner:
        for r in g.rows:
            suffix[r] = g.depth
    one = tuple(_group(g, page_tables, 0) for g in inner)
    nested = tuple(_group(g, page_tables, starts.get(id(g), 0)) for g in inner)
    levels = ((tuple(_group(u, page_tables, 0) for u in outer), nested) if outer else (one,))
    return CascadeLevels(levels, tuple(suffix), one, page_size)


def cascade_levels(batch: object, kv_dtype: object = "bf16", *, rule: CascadeRule | None = None,
                   max_levels: int = 2) -> CascadeLevels | None:
    """find_cascade_groups over a Batch's decode rows, with the rule of kv_dtype unless `rule` is given."""
    return find_cascade_groups(batch.page_tables, batch.seq_lens, batch.page_size,  # type: ignore[attr-defined]
                               rule=rule if rule is not None else rule_for(kv_dtype),
                               q_lens=batch.q_lens, max_levels=max_levels)  # type: ignore[attr-defined]
