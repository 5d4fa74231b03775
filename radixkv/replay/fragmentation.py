"""KV fragmentation at peak: how much of the allocated KV memory holds live tokens. No torch.

Paged (what the run did): `observe(scheduler)` after every step (`Scheduler.update`). Allocated
capacity = pool pages in use x page_size (the same `pool.num_used` that `peak_pages` records). Live
tokens = every filled slot of an allocated page:
- each cached tree page is a full block (the tree only ever holds full blocks): page_size tokens,
  counted once however many running requests share it;
- each running request's private pages (past its locked cached path) hold its computed K/V only:
  `req.num_computed - locked.num_tokens` tokens, so a partly filled tail page counts its filled
  slots and nothing else; the token sampled last has no K/V yet and does not count.
Nothing else holds pages, so these pages are exactly the pool's used pages. The fraction is taken at
the first step where pages in use reach their maximum (the step `peak_pages` reports).

Contiguous baseline (same run, same schedule): each running request reserves its whole max length,
prompt + max_tokens tokens, in one block from admission until it finishes or is preempted; there is
no page and no shared prefix cache, so it holds its own copy of its computed K/V
(`req.num_computed` tokens, cache hits included). It is read at the end of each step's forward pass:
the requests still running plus those that finished in that step (they held their reservation and
their K/V through it; the paged count follows `peak_pages`, read once their pages were released).
The fraction is its live tokens / reserved tokens at the first step where the reservations peak.

Sequential replay (`observe_prompt`): one request at a time, prompts only; at the request where
pages in use peak, live = tree pages x page_size + the request's partial tail; the contiguous
reservation there is that request's prompt + max_tokens with its prompt live.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from radixkv.request import Request
    from radixkv.scheduler.scheduler import Scheduler


@dataclass
class Fragmentation:
    """Live tokens against allocated capacity, at the peak of each allocator."""

    page_size: int
    peak_pages: int = 0  # most pool pages in use after a step
    live_tokens: int = 0  # live tokens in those pages at that step
    contiguous_reserved: int = 0  # most tokens reserved by the contiguous allocator at once
    contiguous_live: int = 0  # tokens held by its requests at that step

    @property
    def live_token_fraction(self) -> float | None:
        """Live tokens / (peak pages x page_size); None when no page was ever in use."""
        return self.live_tokens / (self.peak_pages * self.page_size) if self.peak_pages else None

    @property
    def contiguous_live_fraction(self) -> float | None:
        """Contiguous allocator's held tokens / reserved tokens at its peak; None when nothing ran."""
        return self.contiguous_live / self.contiguous_reserved if self.contiguous_reserved else None

    def observe(self, scheduler: Scheduler, finished: Sequence[Request] = ()) -> None:
        """Record the state after one step: call right after `Scheduler.update`, with the
        requests it returned as finished."""
        running = scheduler.running
        used = scheduler.pool.num_used
        if used > self.peak_pages:
            private = sum(e.req.num_computed - e.locked.num_tokens for e in running)
            self.peak_pages = used
            self.live_tokens = scheduler.cache.num_cached_pages * self.page_size + private
        reserved = (sum(len(e.prompt_arr) + e.req.max_tokens for e in running)
                    + sum(len(r.prompt) + r.max_tokens for r in finished))
        if reserved > self.contiguous_reserved:
            self.contiguous_reserved = reserved
            self.contiguous_live = (sum(e.req.num_computed for e in running)
                                    + sum(r.num_computed for r in finished))

    def observe_prompt(self, pages_in_use: int, prompt_tokens: int, max_tokens: int) -> None:
        """Sequential replay: one request served alone, `pages_in_use` while it held its pages."""
        if pages_in_use > self.peak_pages:
            tail = prompt_tokens % self.page_size
            self.peak_pages = pages_in_use
            self.live_tokens = pages_in_use * self.page_size - (self.page_size - tail if tail else 0)
        if prompt_tokens + max_tokens > self.contiguous_reserved:
            self.contiguous_reserved = prompt_tokens + max_tokens
            self.contiguous_live = prompt_tokens
