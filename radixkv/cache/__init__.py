"""The prefix cache: physical KV pages and the radix tree over them. No torch.

    pool = PagePool(num_pages)          reference-counted pages with a free list
    cache = RadixCache(pool, page_size) token blocks -> pages, LRU eviction of unlocked leaves

Lifetime rules (the contract the scheduler relies on):
- `pool.alloc(n)` hands out n pages at refcount 1, or raises OutOfPages and allocates nothing.
- Every pool operation is all or nothing, also against a KeyboardInterrupt at any bytecode inside it;
  `alloc_into` / `alloc_each` / `adopt` / `release` / `exchange` move pages to or from their holder's
  list in the same step, so an interrupt never leaves a page held by nobody (the scheduler uses these).
- `cache.insert(tokens, pages)` takes the tree's own reference on every page it adopts; the
  caller keeps, and later drops, its own.
- `cache.match(tokens)` returns the longest cached block-aligned prefix (a MatchResult); a caller
  that keeps using its pages `lock`s it and `unlock`s it exactly once; a locked path is never evicted.
- `cache.evict(n)` drops the tree's reference on least-recently-used unlocked leaves.
- `cache.check_invariants()` raises AssertionError naming the broken invariant (invariants 1-6 of docs/cache.md).

Files: pages.py (PagePool), node.py (Node, MatchResult), lru.py (the LRU heap of leaves),
radix_tree.py (RadixCache: lookup; its inserts in tree_insertion.py, locks and eviction in
tree_eviction.py), check.py (the invariant check), events.py (KV events in vLLM's shape:
BlockStored / BlockRemoved / AllBlocksCleared with chain hashes, for `RadixCache(..., events=publisher)`).
"""
from .node import MatchResult, Namespace
from .pages import OutOfPages, PagePool
from .radix_tree import RadixCache

__all__ = ["MatchResult", "Namespace", "OutOfPages", "PagePool", "RadixCache"]
