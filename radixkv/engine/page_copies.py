"""Which pages a quantised extend widens: each distinct page its rows read, once (host arithmetic, numpy).

An extend over FP8 / INT4 pages may read fp16 copies that kernels/dequant_pages.py widens once a layer
(kernels/prefill.py). Rows that share a cached prefix (few-shot prompts, a chat's system prompt) list the
same physical pages: copying each row's table widens a shared page once per row, so a step of 160 rows
over one 5k-token prefix needs 160 copies of it and outgrows any budget. Here the rows' tables are
deduplicated instead:

    distinct_pages(table [B, W], seq_lens [B], page_size, num_pages) -> PageList
        pages [U]      the distinct pages the rows read (a row reads its first ceil(seq_len / page_size)
                       slots), ascending
        table [B, W]   row b's slot w -> the index of its page in `pages` (slots past a row's pages: 0)
        reads          slots read over all rows (>= U; reads / U is how often a copy is read)

so kernels/dequant_pages.py's dequant_page_list widens U pages and the 16-bit kernel reads them through
`table`. PagedAttention.plan lists them for mixed steps where dispatch.extend_copies_wanted says copies may be
read.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np


class PageList(NamedTuple):
    pages: np.ndarray  # int32 [U]
    table: np.ndarray  # int32 [B, W]
    reads: int


def distinct_pages(table: np.ndarray, seq_lens: Sequence[int], page_size: int, num_pages: int) -> PageList:
    """The module docstring's deduplication: a sort of the ids read, or where they are many against the pool
    a mark array over it (O(B * W + num_pages): 1.3 ms for 160 rows x 336 pages in a pool of 100k)."""
    B, W = table.shape
    n = -(-np.asarray(seq_lens, dtype=np.int64) // page_size)
    if B and (n.min() < 0 or n.max() > W):
        raise ValueError(f"distinct_pages: rows read 0..{W} pages, got {n.min()}..{n.max()}")
    read = np.arange(W)[None, :] < n[:, None]  # [B, W]
    ids = table[read]
    out = np.zeros((B, W), dtype=np.int32)
    if ids.size * 16 < num_pages:
        pages, out[read] = np.unique(ids, return_inverse=True)
        return PageList(pages.astype(np.int32), out, int(ids.size))
    index = np.zeros(num_pages, dtype=np.int32)
    index[ids] = 1
    pages = np.flatnonzero(index).astype(np.int32)
    index[pages] = np.arange(len(pages), dtype=np.int32)
    out[read] = index[ids]
    return PageList(pages, out, int(ids.size))
