"""RadixCache's locks and eviction (a mixin of radix_tree.RadixCache): what keeps a path in the tree,
and what takes least recently used leaves out of it and returns their pages to the pool.
Lifetime rules: radix_tree.py's module docstring."""
from __future__ import annotations

import numpy as np

from .events import BlockChains
from .lru import LruLeaves
from .node import HashFn, MatchResult, Namespace, Node, detach_child
from .pages import PagePool


class TreeEviction:
    """lock / unlock / evict / clear of RadixCache."""

    # state of the RadixCache this is mixed into (radix_tree.py sets it up)
    pool: PagePool
    page_size: int
    _hash: HashFn
    _roots: dict[Namespace, Node]
    _bare_roots: dict[Namespace, Node]
    _clock: int
    _lru: LruLeaves
    _num_nodes: int
    _chains: BlockChains | None
    num_cached_pages: int
    num_locked_pages: int
    num_host_pages: int
    num_host_copies: int
    _copies: dict[Node, None]
    host_pool: PagePool | None
    _host_lru: LruLeaves | None
    _demote: bool
    _last_match: object

    def evict_host(self, num_pages: int) -> int: ...  # tree_host.py

    def _keep_root(self, root: Node) -> None:
        """A root that just got a block or a lock: the tree holds it from now on."""
        ns = root.namespace
        if self._roots.get(ns) is not root:
            self._roots[ns] = root
            self._bare_roots.pop(ns, None)

    def _drop_root_if_empty(self, root: Node) -> None:
        """A root that just lost a block or a lock: out of the tree when it holds neither (a match
        still referring to it keeps it, weakly, and may lock it again)."""
        ns = root.namespace
        if not root.children and root.end_locks <= 0 and self._roots.get(ns) is root:
            del self._roots[ns]
            self._bare_roots[ns] = root

    def _path_to_root(self, m: MatchResult, verb: str) -> list[Node]:
        """Nodes from m.node up to (excluding) its root; raises if m is stale or was made by
        another cache (its path does not end at one of this cache's roots)."""
        node = m.node
        if node.host_only:
            raise ValueError(f"{verb} of a stale match: {node} was demoted to the host tier")
        if node.parent is None:
            ns = node.namespace
            if self._roots.get(ns) is not node and self._bare_roots.get(ns) is not node:
                # an evicted node keeps its key; a root has none
                raise ValueError(f"{verb} of a match made by another RadixCache" if len(node.key) == 0
                                 else f"{verb} of a stale match: {node} was evicted")
            return []
        path: list[Node] = []
        tokens = 0
        while node.parent is not None:
            path.append(node)
            tokens += len(node.key)
            node = node.parent
        if self._roots.get(node.namespace) is not node:
            raise ValueError(f"{verb} of a match made by another RadixCache")
        if tokens != m.num_tokens:
            raise ValueError(f"{verb} of a stale match: its path now holds {tokens} of its "
                             f"{m.num_tokens} tokens (the tail was evicted)")
        return path

    def lock(self, m: MatchResult) -> None:
        """Protect the path root..m.node from eviction until unlock(m).

        Raises, changing nothing, for a stale match or one another cache made."""
        path = self._path_to_root(m, "lock")
        m.node.end_locks += 1  # a root too: an empty match's lock is counted, so is its unlock
        if not path:
            self._keep_root(m.node)
        for node in path:
            if node.lock_count == 0:
                self.num_locked_pages += len(node.pages)
            node.lock_count += 1

    def unlock(self, m: MatchResult) -> None:
        """Undo one lock(m). Raises, changing nothing, unless a lock was taken on a match
        ending at m.node (the same path): a lock on a longer match covers m's path but is
        not m's to undo, and a match of another cache is refused."""
        path = self._path_to_root(m, "unlock")
        end = m.node
        if end.end_locks <= 0:
            why = ("only longer matches through it are locked" if end.lock_count else "nothing locks it")
            raise ValueError(f"unlock of an unlocked path at {end}: {why}")
        # lock_count = end_locks + the children's lock_counts: no node of the path goes below zero
        end.end_locks -= 1
        used = end.last_access
        for node in path:
            node.lock_count -= 1
            if node.lock_count == 0:
                self.num_locked_pages -= len(node.pages)
            if node.last_access < used:  # extend touched only the path below its match
                node.last_access = used
            else:
                used = node.last_access
        if path:
            self._push_if_evictable(path[0])
        else:
            self._drop_root_if_empty(end)

    # ---- eviction ----------------------------------------------------------------------------
    def _push_if_evictable(self, node: Node) -> None:
        if self._lru.push(node) and len(self._lru) > 4 * self._num_nodes + 1024:
            self._lru.rebuild(self._roots.values())

    def _cut_leaf(self, node: Node, blocks: str, num_pages: int) -> tuple[np.ndarray, int]:
        """Take the last `num_pages` blocks of leaf `node`'s page ids (`blocks`: "pages" on the GPU, "host" on
        the host tier), or all of them and the node out of the tree (its parent then carries its latest use, see
        _rematch). Returns (the page ids taken, the blocks the node keeps: 0 when it left the tree)."""
        ids = getattr(node, blocks)
        keep = len(ids) - num_pages
        if keep > 0:
            ps = self.page_size
            setattr(node, blocks, ids[:keep])
            node.depth -= len(node.key) - keep * ps
            node.key = node.key[: keep * ps]
            return ids[keep:], keep
        parent = node.parent
        detach_child(node)
        self._num_nodes -= 1
        parent.last_access = max(parent.last_access, node.last_access)
        return ids, 0

    def _take_victims(self, num_pages: int) -> list[np.ndarray]:
        """Remove up to `num_pages` pages from the tree, least recently used leaf first and a
        leaf's tail blocks first. Returns the removed pages (the tree's references not yet dropped)."""
        dropped: list[np.ndarray] = []
        taken = 0
        while taken < num_pages:
            node = self._lru.pop()
            if node is None:
                break
            parent = node.parent
            pages, keep = self._cut_leaf(node, "pages", num_pages - taken)
            if keep:
                self._lru.requeue(node)
            elif parent.parent is None:
                self._drop_root_if_empty(parent)  # its namespace's last block went
            else:
                self._push_if_evictable(parent)
            if self._chains is not None:
                self._chains.removed(node, keep)
            dropped.append(pages)
            taken += len(pages)
        self.num_cached_pages -= taken
        return dropped

    def evict(self, num_pages: int) -> int:
        """Free at least `num_pages` pages (if possible), least recently used leaves first,
        tail blocks of a leaf first. Returns pages actually returned to the pool (a page a
        caller still references leaves the tree but is not freed, so more is evicted)."""
        if num_pages < 0:
            raise ValueError(f"cannot evict {num_pages} pages")
        freed = 0
        while freed < num_pages:
            dropped = self._take_victims(num_pages - freed)
            if not dropped:
                break
            pages = dropped[0] if len(dropped) == 1 else np.concatenate(dropped)
            freed += self.pool.decref_distinct(pages)
        return freed

    def clear(self) -> int:
        """Evict every unlocked page, and every host-tier block; returns GPU pages returned to the pool."""
        if self.num_locked_pages == 0 and (self.num_cached_pages or self.num_host_pages):
            return self._drop_all()
        freed = 0
        self._demote = False  # with a host tier: drop, do not demote
        try:
            while self.num_evictable_pages:
                n = self.num_evictable_pages
                freed += self.evict(n)
                if self.num_evictable_pages == n:
                    break
        finally:
            self._demote = True
        if self.num_host_pages:
            self.evict_host(self.num_host_pages)
        return freed

    def _drop_all(self) -> int:
        """clear() with nothing locked: every node leaves the tree in one pass over it (no LRU
        order to follow when everything goes), and the pages go back in one decref."""
        dropped: list[np.ndarray] = []
        host: list[np.ndarray] = []
        for root in list(self._roots.values()):
            stack = list(root.iter_children())
            root.children = {}
            self._drop_root_if_empty(root)
            while stack:
                node = stack.pop()
                stack.extend(node.iter_children())
                if len(node.pages):
                    dropped.append(node.pages)
                if node.host is not None:
                    host.append(node.host)
                node.children = {}
                node.parent = node.next_sibling = None  # a stale match through it is refused
                node.heap_seq = None
        self._lru = LruLeaves(self._lru.evictable, self._lru._seq)
        if self._host_lru is not None:
            self._host_lru = LruLeaves(self._host_lru.evictable, self._lru._seq)
        if host:
            self.host_pool.decref_distinct(np.concatenate(host))
        self.num_host_pages = self.num_host_copies = 0
        self._copies.clear()
        self._num_nodes = 0
        self.num_cached_pages = 0
        self._last_match = None
        if self._chains is not None:
            self._chains.cleared()
        if not dropped:
            return 0
        return self.pool.decref_distinct(np.concatenate(dropped))
