"""RadixCache's host tier (a mixin of radix_tree.RadixCache): GPU eviction that demotes blocks to host
pages instead of dropping them, host eviction, and promotion back onto GPU pages. No torch.

With `RadixCache(pool, page_size, host_pool=HostPool(n))` every cached block lives on GPU pages
(`node.pages`), on host pages only (`node.host`, `node.pages` empty: `node.host_only`), or on both: a block
loaded back keeps its host copy (the KV of a full block never changes). The tree moves bookkeeping only;
an engine copies the bytes (device-to-host before a demoted page is reused, host-to-device before a
promoted block is read). Rules on top of radix_tree.py's:

- GPU residency is prefix-closed: a node on GPU pages (GPU or both) has ancestors on GPU pages, a host-only
  node host-only descendants. So a match is a GPU prefix (what a caller locks and reads) followed by a
  host-only part (`MatchResult.host_tokens`, `host_path`). Host-only nodes are never locked.
- `evict(n)` takes the least recently used *GPU leaf* (an unlocked node on GPU pages whose children, if
  any, are all host-only; tail blocks first, by splitting the node) and demotes it: a block with a host
  copy just gives up its GPU pages (no copy); any other gets host pages (copied there) and its GPU pages
  are freed. When the host pool is short, host copies of blocks also on GPU are given up first (that
  forgets nothing), then host-only leaves least recently used first are dropped, but only those used
  before the block being demoted; when that is not enough the block is dropped instead (with its host
  subtree). So the whole cache (GPU + host) forgets in exact LRU order, the GPU holds the most recently
  used blocks, and host copies never cost a cached block (they are the first host pages given up).
- `evict_host(n)` gives up host copies of blocks also on GPU (the newest copy first: the GPU keeps those
  blocks longest; tail blocks first), then drops the least recently used host-only leaves (tail first).
- `promote(m, pages)`: the host blocks following the locked match `m` (its `host_path`), as many as
  `pages` (GPU pages the caller allocated and fills), come back to GPU and keep their host pages; the
  lock moves to the longer match, as `extend` moves it. insert / extend through host-only blocks adopt
  the caller's pages for them (the caller holds their KV on GPU: it just computed them), copies kept too.
- `clear()` drops both tiers; `num_cached_pages` / `num_locked_pages` / `num_evictable_pages` count
  GPU pages only, `num_host_pages` the host ones (`num_host_copies` of them the copies of blocks also on
  GPU); `demoted_pages` / `promoted_pages` count the blocks copied each way (bytes moved = pages x bytes
  per page), `demotes_saved` the blocks demoted onto a kept copy.
- Without a host pool none of this runs and the tree is exactly the one-tier tree.

Bytes (`RadixCache(..., host_pool=..., mover=...)`, an engine's HostMover): the tree calls
`mover.demote(gpu_pages, host_pages)` for each block it copies down, before those GPU pages go back to the
pool (never for a block with a host copy), and `mover.promote(host_pages, gpu_pages)` in `load` before the
promoted blocks enter the GPU tier; the mover queues the copies and orders every later reader and writer of
those pages behind them (engine/host_kv.py). A mover that raises is a failed copy: a demotion drops the
block instead (as a full host tier does), a load frees the pages it took and leaves the blocks on host, so
the request recomputes them. Either way no page leaks and the tiers stay consistent (`failed_demotes`,
`failed_promotes` count them).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from .events import MEDIUM_CPU, MEDIUM_GPU
from .lru import LruLeaves
from .node import MatchResult, Node, detach_child
from .pages import OutOfPages, PagePool
from .tree_eviction import TreeEviction

_EMPTY = np.zeros(0, dtype=np.int32)


class HostPool(PagePool):
    """Host (CPU) page ids of the host tier, with their own capacity: a PagePool (free list, refcounts,
    failure-atomic operations); only the tree holds host pages, one reference each."""

    def __init__(self, num_pages: int) -> None:
        if isinstance(num_pages, bool) or not isinstance(num_pages, (int, np.integer)):
            raise TypeError(f"host pool size must be an integer number of pages, got {num_pages!r}")
        if not 0 <= num_pages < 2**31:
            raise ValueError(f"host pool size must be in [0, 2**31) pages, got {num_pages}")
        super().__init__(int(num_pages))


class HostMover(Protocol):
    """Copies a host tier's bytes (engine/host_kv.py HostKV). Both calls get int32 page id arrays of
    equal length, pair by pair; each may only queue its copies, but must order them before any later
    use of the destination pages and before any later write of the source pages."""

    def demote(self, gpu_pages: np.ndarray, host_pages: np.ndarray) -> None: ...

    def promote(self, host_pages: np.ndarray, gpu_pages: np.ndarray) -> None: ...


class TreeHost(TreeEviction):
    """demote (through evict) / evict_host / promote of RadixCache with a host tier."""

    host_pool: PagePool | None
    _host_lru: LruLeaves | None
    num_host_pages: int
    demoted_pages: int
    promoted_pages: int
    _demote: bool
    mover: HostMover | None
    failed_demotes: int
    failed_promotes: int

    def match(self, tokens: Sequence[int] | np.ndarray, namespace: object = None) -> MatchResult: ...  # radix_tree.py

    # ---- GPU eviction: demotion ----------------------------------------------------------------
    def _take_victims(self, num_pages: int) -> list[np.ndarray]:
        if self.host_pool is None:
            return super()._take_victims(num_pages)
        dropped: list[np.ndarray] = []
        taken = 0
        while taken < num_pages:
            node = self._lru.pop()
            if node is None:
                break
            want = num_pages - taken
            if len(node.pages) > want:  # tail blocks first: cut them off into their own node
                self._split(node, len(node.pages) - want)  # the upper part: not a GPU leaf now
            pages = node.pages
            blocks = len(pages)
            if self._demote and node.host is not None:  # it kept its host copy: nothing to copy
                self._forget_copy(node)
                self.demotes_saved += blocks
                if self._chains is not None:
                    self._chains.dropped_from(node, MEDIUM_GPU)
                self._to_host_only(node)
            elif self._demote and (host := self._copy_down(pages, node.last_access)) is not None:
                node.host = host
                self.num_host_pages += blocks
                self.demoted_pages += blocks
                if self._chains is not None:
                    self._chains.moved(node, MEDIUM_GPU, MEDIUM_CPU)
                self._to_host_only(node)
            else:
                self._drop_gpu_node(node)
            dropped.append(pages)
            taken += blocks
        self.num_cached_pages -= taken
        return dropped

    def _to_host_only(self, node: Node) -> None:
        """The GPU leaf `node`, whose blocks now have host pages, gives up its GPU pages (the caller's to
        decref): a host-only leaf, its time handed to its parent."""
        node.pages = _EMPTY
        parent = node.parent
        parent.last_access = max(parent.last_access, node.last_access)
        self._host_lru.push(node)
        if parent.parent is not None:
            self._push_if_evictable(parent)

    def _copy_down(self, pages: np.ndarray, used: int) -> np.ndarray | None:
        """Host pages for the GPU pages `pages` of a block last used at time `used` being demoted, their
        bytes queued to be copied there by the mover; None (nothing held) when the host tier has no room
        for it (_host_room) or the mover failed."""
        if not self._host_room(len(pages), used):
            return None
        host = self.host_pool.alloc_array(len(pages))
        if self.mover is None:
            return host
        try:
            self.mover.demote(pages, host)
        except Exception:  # noqa: BLE001 - a failed copy: the block is dropped instead (module docstring)
            self.host_pool.decref_distinct(host)
            self.failed_demotes += 1
            return None
        return host

    def _drop_gpu_node(self, node: Node) -> None:
        """Take the GPU leaf `node` (its host copy, if any, and its host subtree) out of the tree; its GPU
        pages are the caller's to decref."""
        for child in list(node.iter_children()):
            self._drop_host_subtree(child)
        if node.host is not None:
            self._drop_copy(node)
        parent = node.parent
        detach_child(node)
        self._num_nodes -= 1
        parent.last_access = max(parent.last_access, node.last_access)
        if parent.parent is None:
            self._drop_root_if_empty(parent)
        else:
            self._push_if_evictable(parent)
        if self._chains is not None:
            self._chains.removed(node, 0)

    def _drop_host_subtree(self, top: Node) -> None:
        """Drop the host node `top` and everything below it (host pages freed, events published)."""
        stack, nodes = [top], []
        while stack:
            n = stack.pop()
            nodes.append(n)
            stack.extend(n.iter_children())
        detach_child(top)
        freed = []
        for n in reversed(nodes):  # leaves first: each block's removal names its chain tail
            if self._chains is not None:
                self._chains.removed(n, 0, MEDIUM_CPU)
            freed.append(n.host)
            n.children = {}
            n.parent = n.next_sibling = None
            n.heap_seq = None
            self._num_nodes -= 1
            self.num_host_pages -= len(n.host)
        self.host_pool.decref_distinct(np.concatenate(freed))

    def _host_room(self, blocks: int, used: int) -> bool:
        """Make `blocks` host pages free: by giving up host copies of blocks also on GPU (that forgets
        nothing), then by dropping host leaves used before time `used`, least recently used first;
        whether it succeeded (it may have dropped some either way)."""
        hp = self.host_pool
        if blocks > hp.num_pages:
            return False
        while hp.num_free < blocks:
            if self._copies:
                self._drop_copies(blocks - hp.num_free)
                continue
            victim = self._host_lru.peek()
            if victim is None or victim.last_access > used:
                return False
            self._evict_host_leaf(blocks - hp.num_free)
        return True

    # ---- host eviction ---------------------------------------------------------------------------
    def _forget_copy(self, node: Node) -> None:
        """`node` leaves the both-tiers state (its host pages stay with it, or the caller frees them)."""
        del self._copies[node]
        self.num_host_copies -= len(node.host)

    def _drop_copy(self, node: Node) -> int:
        """Free the host copy of `node`, a block on both tiers (it stays on GPU); returns pages freed."""
        self._forget_copy(node)
        host, node.host = node.host, None
        self.num_host_pages -= len(host)
        if self._chains is not None:
            self._chains.dropped_from(node, MEDIUM_CPU)
        return self.host_pool.decref_distinct(host)

    def _drop_copies(self, num_pages: int) -> int:
        """Free up to `num_pages` host pages of blocks also on GPU, the newest copy first (the blocks the
        GPU keeps longest; a node's tail blocks first); returns pages freed (0: there is no copy)."""
        if not self._copies:
            return 0
        node = next(reversed(self._copies))
        if len(node.host) > num_pages:  # the head keeps its copy: cut the tail blocks off into their own node
            self._split(node, len(node.host) - num_pages)
        return self._drop_copy(node)

    def _evict_host_leaf(self, num_pages: int) -> int:
        """Drop up to `num_pages` tail blocks of the least recently used host leaf; returns pages freed."""
        node = self._host_lru.pop()
        if node is None:
            return 0
        parent = node.parent
        pages, keep = self._cut_leaf(node, "host", num_pages)
        if keep:
            self._host_lru.push(node)
        else:
            node.heap_seq = None
            if parent.parent is None:
                self._drop_root_if_empty(parent)
            elif parent.host_only:
                self._host_lru.push(parent)
            else:
                self._push_if_evictable(parent)
        if self._chains is not None:
            self._chains.removed(node, keep, MEDIUM_CPU)
        self.num_host_pages -= len(pages)
        return self.host_pool.decref_distinct(pages)

    def evict_host(self, num_pages: int) -> int:
        """Free at least `num_pages` host pages (if possible): host copies of blocks also on GPU first
        (_drop_copies), then least recently used host leaves, tail blocks first. Returns host pages
        freed (0 without a host tier)."""
        if num_pages < 0:
            raise ValueError(f"cannot evict {num_pages} host pages")
        if self.host_pool is None:
            return 0
        freed = 0
        while freed < num_pages:
            n = self._drop_copies(num_pages - freed) or self._evict_host_leaf(num_pages - freed)
            if n == 0:
                break
            freed += n
        return freed

    # ---- promotion -------------------------------------------------------------------------------
    def promote(self, m: MatchResult, pages: Sequence[int] | np.ndarray, *, donate: bool = False) -> MatchResult:
        """Bring the first len(pages) host blocks after the locked match `m` (along `m.host_path`) onto
        the GPU pages `pages` (held by the caller; the tree takes its own reference on each, or the
        caller's with donate=True, as extend); they keep their host pages (both tiers). Returns the
        longer match, locked in m's place (unlock it, not m), its `pages` those of the promoted blocks
        from block `pages_from`, its `host_tokens` / `host_path` what is left on host only. Raises, changing nothing, when m is not locked, its host
        path is no longer in the tree below it, or `pages` asks for more blocks than the path holds."""
        if self.host_pool is None:
            raise ValueError("promote needs a host tier (RadixCache(..., host_pool=...))")
        top = m.node
        if top.end_locks <= 0:
            raise ValueError(f"promote of an unlocked match at {top}: lock it first")
        n = len(pages)
        if n == 0:
            return m
        ps = self.page_size
        parent, avail = top, 0
        for node in m.host_path:
            if node.parent is not parent or not node.host_only:
                raise ValueError(f"promote of a stale match: host node {node} left the tree or the host tier")
            avail += len(node.host)
            parent = node
        if n > avail:
            raise ValueError(f"promote of {n} blocks but the match's host path holds {avail}")
        adopt = self._adoptable(pages, 0, n)  # raises before any change
        if not donate:
            self.pool.incref_distinct(adopt.pages, adopt.refcounts)
        arr = adopt.pages
        clock = self._clock = self._clock + 1
        done, moved, rest = 0, [], list(m.host_path)
        while done < n:
            node = rest.pop(0)
            b = len(node.host)
            if b > n - done:  # promote the upper part only: the lower one stays on host
                lower = node
                node = self._split(lower, n - done)
                rest.insert(0, lower)
                b = n - done
            self._keep_copy(node, arr[done: done + b])
            node.last_access = clock
            self.promoted_pages += b
            moved.append(node)
            done += b
        end = moved[-1]
        top.end_locks -= 1
        end.end_locks += 1
        for node in moved:
            node.lock_count += 1
            self.num_locked_pages += len(node.pages)
        top.last_access = clock
        return MatchResult(m.num_tokens + n * ps, arr.tolist(), end, m.num_tokens // ps,
                           m.host_tokens - n * ps, tuple(rest))

    def load(self, tokens: Sequence[int] | np.ndarray, namespace: object, m: MatchResult,
             max_blocks: int) -> MatchResult:
        """Bring up to `max_blocks` of the host blocks following the unlocked match `m` of `tokens`
        back to the GPU: make room (LRU eviction, which demotes), allocate pages, have the mover copy the
        blocks up, promote them. Returns a fresh match of `tokens` (unlocked, like `match`'s): longer by
        the blocks loaded. A mover that raises loads nothing (pages freed, `failed_promotes` counted)."""
        ps, pool = self.page_size, self.pool
        want = min(m.host_tokens // ps, max_blocks)
        if self.host_pool is None or want <= 0:
            return m
        self.lock(m)  # our own GPU prefix is never a victim of the room we make
        cur = m
        try:
            if want > pool.num_free:
                self.evict(want - pool.num_free)  # may drop older host blocks of our own path too
            now = self.match(tokens, namespace)  # same GPU end (locked); what is left on host
            n = min(want, now.host_tokens // ps, pool.num_free) if now.node is m.node else 0
            if n > 0:
                pages = pool.alloc_array(n)
                host = np.concatenate([node.host for node in now.host_path])[:n]
                if self.mover is not None:
                    try:
                        self.mover.promote(host, pages)
                    except Exception:  # noqa: BLE001 - a failed copy: recompute instead (module docstring)
                        pool.decref_distinct(pages)
                        self.failed_promotes += 1
                        n = 0
                if n:
                    try:
                        cur = self.promote(m._replace(host_tokens=now.host_tokens, host_path=now.host_path),
                                           pages, donate=True)
                    except BaseException:
                        pool.decref_distinct(pages)  # (the copy lands in free pages: harmless)
                        raise
        finally:
            self.unlock(cur)
        return self.match(tokens, namespace)

    def _promote_adopted(self, nodes: list[Node], pages: np.ndarray) -> None:
        """Host-only nodes whose blocks a caller computed again: they take `pages` (validated, already
        referenced for the tree) in path order, and keep their host copies."""
        done = 0
        for node in nodes:
            b = len(node.host)
            self._keep_copy(node, pages[done: done + b])
            done += b

    def _keep_copy(self, node: Node, pages: np.ndarray) -> None:
        """The host-only node `node` is on the GPU pages `pages` too (one per block): both tiers."""
        node.pages = pages
        node.heap_seq = None
        self._copies[node] = None
        self.num_host_copies += len(pages)
        self.num_cached_pages += len(pages)
        if self._chains is not None:
            self._chains.stored_on(node, MEDIUM_GPU)


__all__ = ["HostMover", "HostPool", "OutOfPages", "TreeHost"]
