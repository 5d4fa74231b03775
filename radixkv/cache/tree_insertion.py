"""RadixCache's inserts (a mixin of radix_tree.RadixCache): caching new full blocks below a match,
adopting the caller's pages (insert, extend, serve_prompt), and the edge split they need.
Lifetime rules: radix_tree.py's module docstring."""
from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from .node import Descent, MatchResult, Namespace, Node, as_tokens, attach_child, replace_child
from .pages import bad_page_id
from .tree_host import TreeHost


class _Adoption(NamedTuple):
    """Pages insert will adopt, already validated."""

    pages: np.ndarray  # int32 [n]
    refcounts: np.ndarray  # int32 [n], their refcounts before adoption


class TreeInsertion(TreeHost):
    """insert / extend / serve_prompt of RadixCache (they lock, evict and queue leaves: TreeEviction;
    promote host blocks they pass through: TreeHost)."""

    # state beyond TreeEviction's (radix_tree.py sets it up)
    _adoptions: int

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
        run: nothing is evicted or cached (its match still refreshes its path).

        With a host tier the hit counts the host part too: those blocks are promoted onto fresh
        pages (`promote`, counted in `promoted_pages`) instead of being computed again."""
        if self.host_pool is not None:
            return self._serve_prompt_tiered(tokens, private_pages, namespace)
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
            if end.parent is None:
                self._keep_root(end)
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

    def _serve_prompt_tiered(self, tokens: np.ndarray, private_pages: int,
                             namespace: Namespace) -> tuple[int, bool, int]:
        """serve_prompt with a host tier, through match / lock / evict / promote / extend / unlock."""
        ps, pool = self.page_size, self.pool
        full = len(tokens) // ps * ps
        m = self.match(tokens, namespace)
        need = (full - m.num_tokens) // ps + private_pages  # host blocks get GPU pages too
        self.lock(m)
        try:
            if need > pool.num_free:
                if need > pool.num_free + self.num_evictable_pages:
                    return m.num_tokens + m.host_tokens, False, pool.num_used
                self.evict(need - pool.num_free)  # demotes; may drop old host blocks of our path
                now = self.match(tokens, namespace)  # the same GPU part (locked), what is left on host
                m = m._replace(host_tokens=now.host_tokens, host_path=now.host_path)
            hit = m.num_tokens + m.host_tokens
            if m.host_tokens:
                m = self.promote(m, pool.alloc_array(m.host_tokens // ps), donate=True)
            if full > m.num_tokens:
                m = self.extend(m, tokens[m.num_tokens: full], pool.alloc_array((full - m.num_tokens) // ps),
                                donate=True)
            in_use = pool.num_used + private_pages
        finally:
            self.unlock(m)
        return hit, True, in_use

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

    def _graft(self, tokens: np.ndarray, pages: Sequence[int] | np.ndarray, d: Descent, top: Node,
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
        lo = matched // ps  # first block whose page is adopted
        if self.host_pool is not None:  # host-only blocks on the way take the caller's pages
            base = top.depth if top.parent is not None else 0
            for n in (*d.path, d.split_node):
                if n is not None and n.host_only:
                    lo = (n.depth - len(n.key) - base) // ps
                    break
        if lo < nblocks:
            adopt = self._adoptable(pages, lo, nblocks)  # raises before any change
            if not donate:
                self.pool.incref_distinct(adopt.pages, adopt.refcounts)
        node = self._touch(d, top)
        if lo < matched // ps:
            hosted = [n for n in d.path if n.host_only]
            self._promote_adopted(hosted, adopt.pages[: matched // ps - lo])  # (not a host hit)
        if matched < nblocks * ps:
            new_pages = adopt.pages[matched // ps - lo:]
            key = tokens[matched: nblocks * ps]
            # A read-only array cannot change under us: keep a view of it when that does not
            # pin much more memory than a copy would.
            if key.flags.writeable or 2 * len(key) < len(tokens):
                key = key.copy()
            first = key[:ps]
            leaf = Node(key, first.tobytes(), new_pages, node, self._hash(first), top.namespace)
            leaf.last_access = self._clock
            attach_child(node, leaf)
            if node.parent is None:
                self._keep_root(node)
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
        assert parent is not None and 0 < blocks < len(node.key) // ps
        upper = Node(node.key[: blocks * ps], node.first, node.pages[:blocks], None, node.hkey,
                     node.namespace)
        if node.host is not None:  # a host copy: both parts keep theirs
            upper.host = node.host[:blocks]
            node.host = node.host[blocks:]
            if len(upper.pages):  # on both tiers, as node
                self._copies[upper] = None
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
