"""RadixCache: a radix tree over full token blocks mapping prefixes to KV pages. No torch.

Each edge holds a whole number of `page_size`-token blocks (an int32 array) and one page
per block. Children are found by a hash of their first block (xxh3 by default); the block's
tokens are compared on every hit, so a hash collision can never return another prefix's
pages (colliding siblings are chained through `Node.next_sibling`).

Lifetime rules:
- The tree holds one reference on each page it adopted (`insert` increfs them); eviction
  drops that reference. The caller keeps, and later drops, its own references.
- A caller that keeps using matched pages `lock`s the match (its path is then never evicted
  and counts as locked) and `unlock`s it exactly once; a match whose path was since evicted
  is stale. unlock(m) undoes a lock of a match ending at m.node, never one of a longer match
  through it (lock(long); unlock(short) raises). `extend` grows a locked match in place.
- Only leaves' times order eviction. A match refreshes its whole path; `match(since=...)`
  (re-checking an earlier match) only the path's end, and `extend` only the nodes below the
  match it grows (the unlock of the longer match hands their time up). A leaf leaving the
  tree hands its time to its parent, so a node that becomes a leaf carries the latest use of
  its subtree: the order a refresh of every path node would give.
- `num_cached_pages == num_evictable_pages + num_locked_pages` at all times.
- Bad input (too few pages, a non-integer page id, one outside the pool or free, a stale,
  unlocked or other cache's match, a negative eviction count) raises before the tree or the
  pool changes; insert lets a bool id through as 0 or 1 (only a pass over the ids would see it).
  A page listed twice or cached elsewhere in the tree is the caller's bug that insert does not
  look for (a third of insert's time); check_invariants() reports it.
"""
from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np

from .events import BlockChains, KVEventPublisher
from .lru import LruLeaves
from .pages import PagePool, bad_page_id
from .node import (_INT32, HashFn, MatchResult, Namespace, Node, as_tokens, attach_child, detach_child,
                   replace_child, xxhash_block)

__all__ = ["HashFn", "MatchResult", "Namespace", "Node", "RadixCache", "xxhash_block"]

_BYTES_COMPARE_MAX = 16384  # tokens: longer edges are compared with numpy instead of memcmp


class _Descent(NamedTuple):
    """Where tokens leave the tree, found without changing it."""

    path: list[Node]  # whole edges matched, root excluded
    matched: int  # tokens matched, including `split_blocks` blocks of `split_node`
    split_node: Node | None  # an edge the prefix ends inside (it must be split), if any
    split_blocks: int


class _LastMatch(NamedTuple):
    """The latest match of a read-only token array, so that an insert of the same array
    right after (the usual match -> compute -> insert) can skip the walk down the tree."""

    tokens: np.ndarray
    namespace: Namespace
    node: Node
    node_tokens: int  # len(node.key) then: a split or eviction of node since changes it
    matched: int
    adoptions: int  # RadixCache._adoptions then: any insert since may have extended the path


class _Adoption(NamedTuple):
    """Pages insert will adopt, already validated."""

    pages: np.ndarray  # int32 [n]
    refcounts: np.ndarray  # int32 [n], their refcounts before adoption


class RadixCache:
    """Block-keyed radix tree over a PagePool, with LRU eviction and namespaces."""

    def __init__(self, pool: PagePool, page_size: int = 16, hash_fn: HashFn = xxhash_block,
                 events: KVEventPublisher | None = None) -> None:
        """events: a publisher of KV events (cache/events.py) told of every block that enters or
        leaves the tree, with chain hashes; None publishes nothing and costs nothing."""
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self._chains = None if events is None else BlockChains(events, page_size)
        self.pool = pool
        self.page_size = page_size
        self._hash = hash_fn
        self._roots: dict[Namespace, Node] = {}
        self._clock = 0
        self._lru = LruLeaves()
        self._num_nodes = 0
        self._adoptions = 0  # inserts that added a node
        self._last_match: _LastMatch | None = None
        self.num_cached_pages = 0
        self.num_locked_pages = 0

    # ---- sizes -------------------------------------------------------------------------------
    @property
    def num_evictable_pages(self) -> int:
        """Pages on unlocked nodes: an upper bound on what evict() can return to the pool."""
        return self.num_cached_pages - self.num_locked_pages

    @property
    def namespaces(self) -> list[Namespace]:
        """Namespaces seen so far (each has its own root; None is the default)."""
        return list(self._roots)

    def root(self, namespace: Namespace = None) -> Node:
        """The root of `namespace`'s subtree (created empty on first use)."""
        node = self._roots.get(namespace)
        if node is None:
            empty = np.zeros(0, dtype=np.int32)
            node = self._roots[namespace] = Node(empty, b"", empty, None, 0, namespace)
        return node

    # ---- lookup ------------------------------------------------------------------------------
    def _find_child(self, node: Node, block: np.ndarray) -> Node | None:
        child = node.children.get(self._hash(block))
        if child is None:
            return None
        want = block.tobytes()
        while child is not None and child.first != want:
            child = child.next_sibling
        return child

    def _common_blocks(self, edge: np.ndarray, tokens: np.ndarray, pos: int) -> int:
        """Whole blocks shared by `edge` and tokens[pos:] (the first block is known equal)."""
        ps = self.page_size
        n = min(len(edge), (len(tokens) - pos) // ps * ps)
        if n == ps:
            return 1
        ours, theirs = (edge if n == len(edge) else edge[:n]), tokens[pos: pos + n]
        # Equal edges are the common case: memcmp of the bytes is the cheapest test while
        # the copies stay small (big ones would cost fresh pages from the allocator).
        if n <= _BYTES_COMPARE_MAX and ours.tobytes() == theirs.tobytes():
            return n // ps
        diff = ours != theirs
        if n > _BYTES_COMPARE_MAX and not diff.any():
            return n // ps
        return int(diff.argmax()) // ps

    def _descend(self, tokens: np.ndarray, root: Node, pos: int = 0) -> _Descent:
        """Walk down from `root`, which holds tokens[:pos] (path and matched count from there)."""
        ps = self.page_size
        limit = len(tokens) // ps * ps
        node, path = root, []
        while pos < limit:
            child = self._find_child(node, tokens[pos: pos + ps])
            if child is None:
                break
            edge = len(child.key)
            blocks = self._common_blocks(child.key, tokens, pos)
            if blocks * ps < edge:
                return _Descent(path, pos + blocks * ps, child, blocks)
            path.append(child)
            node = child
            pos += edge
        return _Descent(path, pos, None, 0)

    def _touch(self, d: _Descent, root: Node) -> Node:
        """Split the edge the prefix ends inside (if any) and refresh the path's LRU time.

        Returns the node that ends the matched prefix."""
        path = d.path
        if d.split_node is not None:
            path.append(self._split(d.split_node, d.split_blocks))
        clock = self._clock = self._clock + 1
        for node in path:
            node.last_access = clock
        root.last_access = clock
        return path[-1] if path else root

    def match(self, tokens: Sequence[int] | np.ndarray, namespace: Namespace = None, *,
              since: MatchResult | None = None) -> MatchResult:
        """Longest cached prefix of `tokens` in whole blocks; refreshes its LRU time.

        Splits an edge the prefix ends inside, so the result's `node` ends exactly there.

        since: an earlier `match` by this cache of the same leading tokens in this namespace
        (the tokens may have grown since). When its end is still in the tree at the same depth
        and no child of it takes the next block of `tokens`, it is still the longest match: it
        is refreshed (the same LRU order as a fresh match gives) and returned as it is, in O(1)
        instead of a walk over the tokens (a scheduler re-ranking its queue every step).
        Otherwise the tree is walked as without it."""
        tokens = as_tokens(tokens)
        if since is not None:
            m = self._rematch(tokens, namespace, since)
            if m is not None:
                return m
        root = self.root(namespace)
        d = self._descend(tokens, root)
        end = self._touch(d, root)
        path = d.path
        if len(path) == 1:
            pages = path[0].pages.tolist()
        elif path:
            pages = np.concatenate([node.pages for node in path]).tolist()
        else:
            pages = []
        self._push_if_evictable(end)
        if not tokens.flags.writeable:
            self._last_match = _LastMatch(tokens, namespace, end, len(end.key), d.matched, self._adoptions)
        return MatchResult(d.matched, pages, end)

    def match_many(self, queries: Iterable[tuple[Sequence[int] | np.ndarray, Namespace, MatchResult | None]]
                   ) -> list[MatchResult]:
        """[match(tokens, namespace, since=since) for tokens, namespace, since in queries], the
        same results and the same LRU refreshes in the same order, with the O(1) re-check of
        `since` done inline (a scheduler re-ranks its whole queue every step this way)."""
        out: list[MatchResult] = []
        ps, roots, lru = self.page_size, self._roots, self._lru
        for tokens, namespace, since in queries:
            if since is not None and type(tokens) is np.ndarray and tokens.dtype is _INT32:
                n, end = since.num_tokens, since.node
                root = roots.get(namespace)
                # _rematch's tests, in its order (see there)
                if (root is not None and not since.pages_from and n <= len(tokens) and end.depth == n
                        and (end.parent is not None or end is root) and end.namespace == namespace
                        and tokens.ndim == 1 and tokens.flags.c_contiguous
                        and not (end.children and n + ps <= len(tokens)
                                 and self._find_child(end, tokens[n: n + ps]) is not None)):
                    clock = self._clock = self._clock + 1
                    end.last_access = clock
                    root.last_access = clock
                    if not end.children and not end.lock_count and end.parent is not None:
                        lru.push_leaf(end)
                    out.append(since)
                    continue
            out.append(self.match(tokens, namespace, since=since))
        if len(self._lru) > 4 * self._num_nodes + 1024:
            self._lru.rebuild(self._roots.values())
        return out

    def _rematch(self, tokens: np.ndarray, namespace: Namespace, prev: MatchResult) -> MatchResult | None:
        """The longest match of `tokens` starting from `prev` (see match's `since`), or None when
        only a walk from the root can tell (prev's end left the tree)."""
        ps, n, end = self.page_size, prev.num_tokens, prev.node
        root = self._roots.get(namespace)
        if prev.pages_from or n > len(tokens) or root is None or end.namespace != namespace:
            return None
        # End still in the tree (an evicted node's parent is None, and only a leaf leaves) at the
        # same depth (a node's depth drops only when its own tail is evicted; a split keeps the
        # lower part's) is the same path with the same pages.
        if end.parent is None and end is not root:
            return None
        depth = end.depth
        if depth != n:  # its tail was evicted since: the rest of it still matches
            if depth > n:
                return None
            prev = MatchResult(depth, prev.pages[: depth // ps], end)
            n = depth
        if end.children and n + ps <= len(tokens) and self._find_child(end, tokens[n: n + ps]) is not None:
            # cached since below the end: walk on from there only, not from the root
            d = self._descend(tokens, end, n)
            new_end = self._touch(d, end)  # splits where the match ends inside an edge
            root.last_access = self._clock
            self._push_if_evictable(new_end)
            more = np.concatenate([x.pages for x in d.path]).tolist() if d.path else []
            return MatchResult(d.matched, prev.pages + more, new_end)
        # Refresh the end only: the nodes above it keep older times, which eviction never reads
        # while they have children, and a child leaving the tree hands its time to its parent
        # (_take_victims), so every leaf is evicted at the time a full-path refresh would give it.
        clock = self._clock = self._clock + 1
        end.last_access = clock
        root.last_access = clock
        if not end.children and not end.lock_count and end.parent is not None:
            self._push_if_evictable(end)
        return prev

    def serve_prompt(self, tokens: np.ndarray, private_pages: int = 0,
                     namespace: Namespace = None) -> tuple[int, bool, int]:
        """One request served start to finish, as a sequential replay serves it: match `tokens`
        (a C-contiguous int32 array, e.g. from `as_tokens`), make room for its uncached full
        blocks plus `private_pages` pages only it uses (a partial tail), cache those blocks with
        fresh pool pages that the tree then holds alone, and release the request.

        Leaves the tree, pool and LRU order as match, lock, evict (when the pool is short),
        alloc, extend(..., donate=True), unlock and the decref of the private pages would, one
        after the other; the private pages are only counted, never allocated (nothing could see
        them between the allocation and the release). Returns (cached tokens matched, whether
        it ran, pool pages in use while it held its own, private ones included). A request
        needing more pages than the pool can give even after evicting everything else does not
        run: nothing is evicted or cached (its match still refreshes its path)."""
        ps, pool = self.page_size, self.pool
        root = self.root(namespace)
        d = self._descend(tokens, root)
        end = self._touch(d, root)
        self._push_if_evictable(end)
        hit = d.matched
        full = len(tokens) // ps * ps
        blocks = (full - hit) // ps
        need = blocks + private_pages
        locked = None
        if need > pool.num_free:
            locked = MatchResult(hit, [], end)
            self.lock(locked)  # our own path is never a victim
            if need > pool.num_free + self.num_evictable_pages:
                self.unlock(locked)
                return hit, False, pool.num_used
            self.evict(need - pool.num_free)
        if blocks:
            pages = pool.alloc_array(blocks)  # refcount 1 each: the tree's reference from now on
            key = tokens[hit:full]
            if key.flags.writeable or 2 * len(key) < len(tokens):
                key = key.copy()
            first = key[:ps]
            clock = self._clock = self._clock + 1
            leaf = Node(key, first.tobytes(), pages, end, self._hash(first), end.namespace)
            leaf.last_access = clock
            attach_child(end, leaf)
            if self._chains is not None:
                self._chains.stored(leaf)
            self.num_cached_pages += blocks
            self._num_nodes += 1
            self._adoptions += 1
            node = end  # extend's touch of `end`, then unlock handing that time up the path
            while node.parent is not None:
                node.last_access = clock
                node = node.parent
            if node is end:
                end.last_access = clock
            self._push_if_evictable(leaf)
        in_use = pool.num_used + private_pages
        if locked is not None:
            self.unlock(locked)
        return hit, True, in_use

    def _descend_again(self, tokens: np.ndarray, namespace: Namespace, root: Node) -> _Descent | None:
        """The latest match's descent if it still holds for `tokens` (None otherwise)."""
        last = self._last_match
        if (last is None or last.tokens is not tokens or last.namespace != namespace
                or last.adoptions != self._adoptions):
            return None
        node = last.node
        if node is root:
            return _Descent([], 0, None, 0)
        if node.parent is None or len(node.key) != last.node_tokens:
            return None  # evicted or split since
        path = []
        while node is not root:
            path.append(node)
            node = node.parent
        path.reverse()
        return _Descent(path, last.matched, None, 0)

    # ---- insert ------------------------------------------------------------------------------
    def _adoptable(self, pages: Sequence[int] | np.ndarray, start: int, stop: int) -> _Adoption:
        """pages[start:stop] as int32, checked to be in the pool and held (refcount >= 1);
        raises IndexError / ValueError naming the page otherwise, changing nothing.

        Not checked here, to keep insert to a handful of numpy calls: that the pages are
        distinct and not already in the tree (check_invariants() reports either)."""
        if isinstance(pages, np.ndarray):
            if pages.dtype.kind not in "iu" or pages.ndim != 1:
                raise ValueError(f"pages must be a flat integer array, got {pages.dtype} {pages.shape}")
            arr = pages[start:stop].astype(np.int64)  # a copy: the caller may reuse its array
            if arr.size and arr.min() < 0:
                raise IndexError(f"page {int(arr[arr < 0][0])} outside pool of {self.pool.num_pages}")
        else:
            plist = pages[start:stop]
            try:  # 'I' rejects negative and non-integer ids; the pool rejects ids past its end
                arr = np.frombuffer(struct.pack(f"{len(plist)}I", *plist), dtype=np.uint32)
            except struct.error:
                raise bad_page_id(plist, self.pool.num_pages) from None
            # A bool packs as 0 or 1 and is not looked for here: finding one costs a pass over
            # the ids (the pool's incref/decref do refuse them).
        held = self.pool.check_held(arr)  # int32 [n]
        arr = arr.view(np.int32) if arr.dtype.itemsize == 4 else arr.astype(np.int32)  # ids < 2**31
        return _Adoption(arr, held)

    def insert(self, tokens: Sequence[int] | np.ndarray, pages: Sequence[int] | np.ndarray,
               namespace: Namespace = None) -> int:
        """Cache the full blocks of `tokens` with `pages` (one per full block; extra trailing
        pages, e.g. a partial tail's, are ignored).

        Blocks already cached keep the tree's pages (the caller's are not adopted); the tree
        increfs each page it adopts. Returns how many leading tokens were already cached.
        A read-only `tokens` array may be kept as a view (it must not change later)."""
        tokens = as_tokens(tokens)
        root = self.root(namespace)
        d = self._descend_again(tokens, namespace, root) or self._descend(tokens, root)
        self._graft(tokens, pages, d, root)
        return d.matched

    def extend(self, m: MatchResult, tokens: Sequence[int] | np.ndarray,
               pages: Sequence[int] | np.ndarray, *, donate: bool = False) -> MatchResult:
        """Cache the full blocks of `tokens`, the tokens that follow the locked match `m`, and
        move that lock to the longer match: chunked prefill's insert, linear in `tokens` (no
        walk from the root).

        `pages` holds one page per full block of `tokens`, adopted as `insert` adopts them.
        Returns the longer match, locked in m's place (unlock it, not m); its `pages` start at
        block `pages_from` = m.num_tokens // page_size, the blocks of `tokens`. Raises, changing
        nothing, when m is not locked. That m is this cache's match is the caller's duty (a
        locked match is never stale); checking it would cost the walk to the root.

        donate=True: the caller hands the tree its own reference on each page the tree adopts
        (no incref; the caller must not decref those). The adopted pages are pages[k:b], b =
        len(tokens) // page_size and k the leading blocks of `tokens` already cached below m
        (0 when m was the longest match of its tokens, as right after `match`, with no insert
        since); pages[:k] and pages[b:] stay the caller's. Saves an incref and a decref per
        adopted page for a caller that drops its pages right after (a sequential replay)."""
        tokens = as_tokens(tokens)
        top = m.node
        if top.end_locks <= 0:
            raise ValueError(f"extend of an unlocked match at {top}: lock it first")
        d = self._descend(tokens, top)
        end = self._graft(tokens, pages, d, top, donate)
        path: list[Node] = []
        node = end
        while node is not top:
            path.append(node)
            node = node.parent
        if path:  # the lock now ends at `end`: one more on each node below top
            top.end_locks -= 1
            end.end_locks += 1
            for node in path:
                if node.lock_count == 0:
                    self.num_locked_pages += len(node.pages)
                node.lock_count += 1
        path.reverse()
        pages_out = np.concatenate([n.pages for n in path]).tolist() if path else []
        return MatchResult(m.num_tokens + len(tokens) // self.page_size * self.page_size, pages_out, end,
                           m.num_tokens // self.page_size)

    def _graft(self, tokens: np.ndarray, pages: Sequence[int] | np.ndarray, d: _Descent, top: Node,
               donate: bool = False) -> Node:
        """Cache the full blocks of `tokens` below `top`, where descent d (from top) left the
        tree; returns the node that ends them. Raises before any change for bad pages.
        donate: adopt the caller's reference on each new page instead of taking one."""
        ps = self.page_size
        nblocks = len(tokens) // ps
        if len(pages) < nblocks:
            raise ValueError(f"one page per full block is needed: {nblocks} blocks, {len(pages)} pages")
        matched = d.matched
        adopt = None
        if matched < nblocks * ps:
            adopt = self._adoptable(pages, matched // ps, nblocks)  # raises before any change
        node = self._touch(d, top)
        if adopt is not None:
            new_pages = adopt.pages
            if not donate:
                self.pool.incref_distinct(new_pages, adopt.refcounts)
            key = tokens[matched: nblocks * ps]
            # A read-only array cannot change under us: keep a view of it when that does not
            # pin much more memory than a copy would.
            if key.flags.writeable or 2 * len(key) < len(tokens):
                key = key.copy()
            first = key[:ps]
            leaf = Node(key, first.tobytes(), new_pages, node, self._hash(first), top.namespace)
            leaf.last_access = self._clock
            attach_child(node, leaf)
            if self._chains is not None:
                self._chains.stored(leaf)
            self.num_cached_pages += len(new_pages)
            self._num_nodes += 1
            self._adoptions += 1
            node = leaf
        self._push_if_evictable(node)
        return node

    def _split(self, node: Node, blocks: int) -> Node:
        """Cut `node`'s edge after `blocks` blocks; returns the new upper node (node stays below,
        so a MatchResult ending at `node` still ends at it)."""
        ps = self.page_size
        parent = node.parent
        assert parent is not None and 0 < blocks < len(node.pages)
        upper = Node(node.key[: blocks * ps], node.first, node.pages[:blocks], None, node.hkey,
                     node.namespace)
        upper.lock_count = node.lock_count  # every lock on node's path also covers its prefix
        # upper.end_locks stays 0: a match that ended at node still ends at node
        upper.last_access = node.last_access
        upper.depth = node.depth - len(node.key) + blocks * ps  # node (the lower part) keeps its depth
        replace_child(parent, node, upper)  # upper takes node's place among the siblings
        node.key = node.key[blocks * ps:]
        node.pages = node.pages[blocks:]
        first = node.key[:ps]
        node.first = first.tobytes()
        node.hkey = self._hash(first)
        node.next_sibling = None
        attach_child(upper, node)
        if self._chains is not None:
            self._chains.split(upper, node, blocks)
        self._num_nodes += 1
        return upper

    # ---- locks -------------------------------------------------------------------------------
    def _path_to_root(self, m: MatchResult, verb: str) -> list[Node]:
        """Nodes from m.node up to (excluding) its root; raises if m is stale or was made by
        another cache (its path does not end at one of this cache's roots)."""
        node = m.node
        if node.parent is None:
            if self._roots.get(node.namespace) is not node:  # an evicted node keeps its key; a root has none
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

    # ---- eviction ----------------------------------------------------------------------------
    def _push_if_evictable(self, node: Node) -> None:
        if self._lru.push(node) and len(self._lru) > 4 * self._num_nodes + 1024:
            self._lru.rebuild(self._roots.values())

    def _take_victims(self, num_pages: int) -> list[np.ndarray]:
        """Remove up to `num_pages` pages from the tree, least recently used leaf first and a
        leaf's tail blocks first. Returns the removed pages (the tree's references not yet dropped)."""
        dropped: list[np.ndarray] = []
        taken = 0
        ps = self.page_size
        while taken < num_pages:
            node = self._lru.pop()
            if node is None:
                break
            keep = len(node.pages) - (num_pages - taken)
            if keep > 0:
                pages = node.pages[keep:]
                node.pages = node.pages[:keep]
                node.depth -= len(node.key) - keep * ps
                node.key = node.key[: keep * ps]
                self._lru.requeue(node)
            else:
                pages = node.pages
                parent = node.parent
                detach_child(node)
                self._num_nodes -= 1
                # see _rematch: once a leaf, the parent carries its subtree's latest use
                parent.last_access = max(parent.last_access, node.last_access)
                self._push_if_evictable(parent)
            if self._chains is not None:
                self._chains.removed(node, max(keep, 0))
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
        """Evict every unlocked page; returns pages returned to the pool."""
        if self.num_locked_pages == 0 and self.num_cached_pages:
            return self._drop_all()
        freed = 0
        while self.num_evictable_pages:
            n = self.num_evictable_pages
            freed += self.evict(n)
            if self.num_evictable_pages == n:
                break
        return freed

    def _drop_all(self) -> int:
        """clear() with nothing locked: every node leaves the tree in one pass over it (no LRU
        order to follow when everything goes), and the pages go back in one decref."""
        dropped: list[np.ndarray] = []
        for root in self._roots.values():
            stack = list(root.iter_children())
            root.children = {}
            while stack:
                node = stack.pop()
                stack.extend(node.iter_children())
                dropped.append(node.pages)
                node.children = {}
                node.parent = node.next_sibling = None  # a stale match through it is refused
                node.heap_seq = None
        self._lru = LruLeaves()
        self._num_nodes = 0
        self.num_cached_pages = 0
        self._last_match = None
        if self._chains is not None:
            self._chains.cleared()
        if not dropped:
            return 0
        return self.pool.decref_distinct(np.concatenate(dropped))

    # ---- invariants --------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Raise AssertionError naming the node and the broken invariant (DESIGN.md 1-6)."""
        # imported here: the check is on no hot path, and each command's start-up skips it
        from .check import TreeView, check_tree

        check_tree(TreeView(self.page_size, self.pool, self._roots, self._lru, self._hash, self.num_cached_pages,
                            self.num_locked_pages, self._num_nodes))
