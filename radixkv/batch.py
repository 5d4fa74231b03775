"""Batch: the one object passed from the scheduler to the model each step. No torch.

Rows are requests; tokens are the new tokens computed this step, concatenated in row order.
A decode row has q_len 1; a prefill row holds one chunk of its prompt (chunked prefill).
Before the model runs, every slot in `slots` belongs to a page in that row's page table,
and the pages listed for a row cover all `seq_lens[b]` tokens.
`page_tables[b]` may be the scheduler's own page list of that request (no copy per step): it is
valid until `Scheduler.update`, and the model must not modify it.
A batch scheduled ahead (`follows` set) is planned while the previous batch still runs: its leading
decode rows read their input tokens from that batch's sampled tokens on the device; its rows whose request
has finished meanwhile are dropped by `update`.
`cascade`: the step's cascade levels (CascadeLevels below; scheduler/cascade_groups.py finds them).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .request import Request


@dataclass(frozen=True)
class CascadeGroup:
    """Rows (batch indices, ascending) whose page tables all hold `pages` at page_start onwards."""

    rows: tuple[int, ...]
    page_start: int
    pages: tuple[int, ...]

    @property
    def page_end(self) -> int:
        return self.page_start + len(self.pages)

    def tokens(self, page_size: int) -> int:
        return len(self.pages) * page_size


@dataclass(frozen=True)
class CascadeLevels:
    """The cascade of one decode step (module docstring): levels outermost first, each a tuple of groups
    (a row in at most one group a level); suffix_start[b]: page index where row b's own pages begin
    (0 for a row in no group); one_level: the best single level (runs from page 0), plan_cascade's input."""

    levels: tuple[tuple[CascadeGroup, ...], ...]
    suffix_start: tuple[int, ...]  # [B]
    one_level: tuple[CascadeGroup, ...]
    page_size: int

    @property
    def num_levels(self) -> int:
        return len(self.levels)

    def plan_groups(self) -> list[tuple[list[int], int]]:
        """one_level as kernels.cascade_plan.plan_cascade's `groups`: (rows, shared_tokens) pairs."""
        return [(list(g.rows), g.tokens(self.page_size)) for g in self.one_level]

    def plan_outer(self) -> list[tuple[list[int], int]]:
        """The outer level as plan_cascade's `outer` ((rows, shared tokens) pairs; plan_groups() is then
        the inner level, its tokens also counted from token 0); [] with one level."""
        if self.num_levels < 2:
            return []
        return [(list(g.rows), g.tokens(self.page_size)) for g in self.levels[0]]

    def outer_units(self) -> tuple[int, ...]:
        """Per outer group: the inner groups under it plus its rows in none (each would read the outer run
        once on one level); () with one level."""
        if self.num_levels < 2:
            return ()
        inner_of = {r: i for i, g in enumerate(self.levels[1]) for r in g.rows}
        return tuple(len({inner_of.get(r, ("row", r)) for r in g.rows}) for g in self.levels[0])

    @property
    def pages_saved(self) -> int:
        """Page reads a step saves over plain decode with all levels: sum of (rows - 1) x pages."""
        return sum((len(g.rows) - 1) * len(g.pages) for level in self.levels for g in level)



@dataclass
class Batch:
    requests: list[Request]  # [B]
    input_ids: list[int]  # [T] new tokens of all rows, concatenated
    positions: list[int]  # [T] absolute position of each new token in its sequence
    q_start: list[int]  # [B] first index of row b in input_ids
    q_lens: list[int]  # [B] new tokens of row b (its LAST q_lens[b] of seq_lens[b] tokens)
    seq_lens: list[int]  # [B] tokens of row b in the KV cache once this step has run
    page_tables: list[list[int]]  # [B][ceil(seq_lens[b] / page_size)] physical page ids
    slots: list[int]  # [T] page * page_size + offset where each new token's K/V is stored
    sample: list[bool]  # [B] row b produces a token this step (decode, or last prefill chunk)
    page_size: int
    # decode rows sharing cached pages, for the cascade kernels (scheduler/cascade_groups.py); None: plain
    # decode (the scheduler builds it only with SchedulerConfig(cascade=True), when a group is worth it)
    cascade: CascadeLevels | None = None
    # a step scheduled ahead (Scheduler.schedule_ahead) while the previous batch still runs; None: a plain step.
    # [K] its first K rows (decode rows, leading the batch) take as input the token the previous batch's
    # follows[b]-th sampling row draws (Launched.drawn[follows[b]]), not known on the host yet (input_ids hold 0)
    follows: list[int] | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def is_decode_only(self) -> bool:
        return all(n == 1 for n in self.q_lens)

    def check(self) -> None:
        """Assert the shape relations documented above (cheap; tests call it every step)."""
        B = len(self.requests)
        assert len(self.q_start) == len(self.q_lens) == len(self.seq_lens) == B
        assert len(self.page_tables) == len(self.sample) == B
        assert len(self.positions) == len(self.slots) == len(self.input_ids) == sum(self.q_lens)
        start = 0
        for b in range(B):
            assert self.q_start[b] == start, f"row {b}: q_start {self.q_start[b]} != {start}"
            assert 1 <= self.q_lens[b] <= self.seq_lens[b], f"row {b}: bad q_len {self.q_lens[b]}"
            need = -(-self.seq_lens[b] // self.page_size)
            assert len(self.page_tables[b]) >= need, f"row {b}: {len(self.page_tables[b])} pages < {need}"
            for i in range(self.q_lens[b]):
                pos = self.seq_lens[b] - self.q_lens[b] + i
                assert self.positions[start + i] == pos, f"row {b}: position {i} is not {pos}"
                page = self.page_tables[b][pos // self.page_size]
                assert self.slots[start + i] == page * self.page_size + pos % self.page_size
            start += self.q_lens[b]


class BatchBuilder:
    """Accumulates the rows of one step into a Batch (the scheduler fills one per step)."""

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self.requests: list[Request] = []
        self.input_ids: list[int] = []
        self.positions: list[int] = []
        self.q_start: list[int] = []
        self.q_lens: list[int] = []
        self.seq_lens: list[int] = []
        self.page_tables: list[list[int]] = []
        self.slots: list[int] = []
        self.sample: list[bool] = []
        self.follows: list[int] = []

    def follow(self, reqs: list[Request], positions: list[int], drawn: list[int]) -> None:
        """Decode rows: reqs[i] at positions[i], whose input is the previous batch's drawn[drawn[i]] (a step
        scheduled ahead: that token is not on the host yet). They come before any other row."""
        if len(self.requests) != len(self.follows):
            raise ValueError("BatchBuilder.follow: rows following the previous batch lead the batch")
        ps, n, first = self.page_size, len(reqs), len(self.input_ids)
        pages = [r.pages for r in reqs]
        self.follows += drawn
        self.requests += reqs
        self.q_start += range(first, first + n)
        self.q_lens += [1] * n
        self.seq_lens += [p + 1 for p in positions]
        self.page_tables += pages
        self.sample += [True] * n
        self.input_ids += [0] * n
        self.positions += positions
        self.slots += [table[p // ps] * ps + p % ps for table, p in zip(pages, positions)]

    def add(self, req: Request, start: int, q_len: int) -> None:
        """Row computing tokens [start, start + q_len) of req's prompt + output."""
        end = start + q_len
        self.requests.append(req)
        self.q_start.append(len(self.input_ids))
        self.q_lens.append(q_len)
        self.seq_lens.append(end)
        self.page_tables.append(req.pages)  # the live list, not a copy (see the module docstring)
        self.sample.append(end == req.num_tokens)
        self.input_ids.extend(_token_slice(req, start, end))
        self.positions.extend(range(start, end))
        self.slots.extend(_slots(req.pages, start, end, self.page_size))

    def build(self, ahead: bool = False) -> Batch:
        """The Batch; ahead: a step scheduled ahead (`follows` set, possibly empty)."""
        return Batch(self.requests, self.input_ids, self.positions, self.q_start, self.q_lens,
                     self.seq_lens, self.page_tables, self.slots, self.sample, self.page_size,
                     follows=self.follows if ahead else None)


def _token_slice(req: Request, start: int, end: int) -> list[int]:
    prompt, n = req.prompt, len(req.prompt)
    if end <= n:
        part = prompt[start:end]
        return part if isinstance(part, list) else part.tolist()
    if start >= n:
        return req.output[start - n: end - n]
    head = prompt[start:]
    return (head if isinstance(head, list) else head.tolist()) + req.output[: end - n]


def _slots(pages: list[int], start: int, end: int, ps: int) -> list[int]:
    """page * page_size + offset of positions start..end-1."""
    if end - start <= 64:
        return [pages[p // ps] * ps + p % ps for p in range(start, end)]
    first = start // ps
    pos = np.arange(start, end, dtype=np.int64)  # [q_len]
    table = np.asarray(pages[first: (end - 1) // ps + 1], dtype=np.int64)
    return (table[pos // ps - first] * ps + pos % ps).tolist()
