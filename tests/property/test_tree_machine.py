"""Hypothesis state machine: PagePool + RadixCache against a naive model.

The model keeps, per namespace, a dict from cached block prefixes (tuples of block ids) to
the page holding the prefix's last block and the clock of its last use. Blocks come from a
tiny alphabet so prefixes collide, and blocks 0/2 (and 1/3) differ only in their last token.
After every step the tree must hold exactly the model's prefixes with the model's pages
(invariants 2, 3, 5), `check_invariants()` must pass (1-4), and the page counts must add up;
eviction must free exactly the least recently used unlocked blocks the model picks (4);
teardown unlocks everything, clears the tree and finds every page free (6).
"""
from __future__ import annotations

import itertools
from typing import NamedTuple

import numpy as np
import pytest
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from radixkv import MatchResult, OutOfPages, PagePool, RadixCache

Namespace = str | None
Prefix = tuple[int, ...]  # block ids
NAMESPACES = st.sampled_from([None, None, "a", "b"])
NUM_BLOCK_IDS = 4


class Cached(NamedTuple):
    page: int
    last_use: int
    serial: int  # identity of this caching of the block (a re-insert after eviction is new)


class Held(NamedTuple):
    """A match the test keeps: its namespace, prefix, and the serial of its last block."""

    match: MatchResult
    ns: Namespace
    prefix: Prefix
    last_serial: int | None


class TreeMachine(RuleBasedStateMachine):
    PAGE_SIZE = 2
    NUM_PAGES = 10  # small: evictions, stale matches and OutOfPages all happen
    HASH_FN = None  # None: the tree's default (xxh3)

    def __init__(self) -> None:
        super().__init__()
        self.pool = PagePool(self.NUM_PAGES)
        kw = {} if self.HASH_FN is None else {"hash_fn": self.HASH_FN}
        self.cache = RadixCache(self.pool, page_size=self.PAGE_SIZE, **kw)
        ps = self.PAGE_SIZE
        self.patterns = [([b % 2] * (ps - 1) + [b]) if ps > 1 else [b] for b in range(NUM_BLOCK_IDS)]
        self.block_of = {tuple(p): b for b, p in enumerate(self.patterns)}
        self.model: dict[Namespace, dict[Prefix, Cached]] = {}
        self.clock = 0
        self.serials = itertools.count()
        self.locked: list[Held] = []
        self.seen: list[Held] = []  # old matches, some of them stale by now
        self.earlier: list[tuple[Namespace, list[int], MatchResult]] = []  # for match(since=...)
        self.pending: tuple[Namespace, list[int], np.ndarray] | None = None  # see match_read_only

    # ---- helpers -------------------------------------------------------------------------
    def tokens(self, bids: list[int], tail: int, readonly: bool = False) -> list[int] | np.ndarray:
        """Tokens for block ids plus a partial tail; as a read-only array when `readonly`
        (the tree may then keep views of it and reuse a match's walk in insert)."""
        out = [t for b in bids for t in self.patterns[b]] + [7] * (tail % self.PAGE_SIZE)
        if not readonly:
            return out
        arr = np.array(out, dtype=np.int32)
        arr.flags.writeable = False
        return arr

    def model_match(self, ns: Namespace, bids: list[int]) -> Prefix:
        cached = self.model.get(ns, {})
        k = 0
        while k < len(bids) and tuple(bids[: k + 1]) in cached:
            k += 1
        return tuple(bids[:k])

    def touch(self, ns: Namespace, prefix: Prefix) -> None:
        self.clock += 1
        cached = self.model.setdefault(ns, {})
        for i in range(1, len(prefix) + 1):
            cached[prefix[:i]] = cached[prefix[:i]]._replace(last_use=self.clock)

    def model_pages(self, ns: Namespace, prefix: Prefix) -> list[int]:
        return [self.model[ns][prefix[:i]].page for i in range(1, len(prefix) + 1)]

    def is_locked(self, ns: Namespace, prefix: Prefix) -> bool:
        return any(h.ns == ns and h.prefix[: len(prefix)] == prefix for h in self.locked)

    def model_evict(self, n: int) -> int:
        """Remove up to n blocks, least recently used unlocked leaf block first."""
        removed = 0
        while removed < n:
            leaves = [(c.last_use, ns, p) for ns, cached in self.model.items() for p, c in cached.items()
                      if not self.is_locked(ns, p) and not any(q[:-1] == p for q in cached)]
            if not leaves:
                break
            _, ns, p = min(leaves)
            del self.model[ns][p]
            removed += 1
        return removed

    def serial_of(self, ns: Namespace, prefix: Prefix) -> int | None:
        c = self.model.get(ns, {}).get(prefix) if prefix else None
        return None if c is None else c.serial

    def match(self, ns: Namespace, bids: list[int], tail: int, tokens=None) -> Held:
        """Tree match, checked against the model; refreshes both."""
        ps = self.PAGE_SIZE
        m = self.cache.match(self.tokens(bids, tail) if tokens is None else tokens, ns)
        prefix = self.model_match(ns, bids)
        assert m.num_tokens == len(prefix) * ps, f"match {m.num_tokens} tokens, model {len(prefix) * ps}"
        assert m.pages == self.model_pages(ns, prefix), "match returned other pages than the model's"
        self.touch(ns, prefix)
        return Held(m, ns, prefix, self.serial_of(ns, prefix))

    def tree_contents(self) -> dict[tuple[Namespace, Prefix], int]:
        ps, out = self.PAGE_SIZE, {}
        for ns in self.cache.namespaces:
            stack: list = [(self.cache.root(ns), ())]
            while stack:
                node, prefix = stack.pop()
                for child in node.iter_children():
                    p = prefix
                    for i, page in enumerate(child.pages.tolist()):
                        p = p + (self.block_of[tuple(child.key[i * ps:(i + 1) * ps].tolist())],)
                        out[(ns, p)] = page
                    stack.append((child, p))
        return out

    # ---- rules ---------------------------------------------------------------------------
    @rule(ns=NAMESPACES, bids=st.lists(st.integers(0, NUM_BLOCK_IDS - 1), max_size=6),
          tail=st.integers(0, 15), keep=st.sampled_from([False, False, False, True]),
          readonly=st.booleans())
    def request(self, ns: Namespace, bids: list[int], tail: int, keep: bool, readonly: bool) -> None:
        """match -> lock -> evict if short -> alloc the missing pages -> insert -> release.

        keep: the request goes on running, holding a lock on its whole cached prompt."""
        cache, pool = self.cache, self.pool
        tokens = self.tokens(bids, tail, readonly)
        held = self.match(ns, bids, tail, tokens)
        m = held.match
        cache.lock(m)
        self.locked.append(held)
        need = len(bids) - len(held.prefix)
        if need > pool.num_free:
            short = need - pool.num_free
            expect = self.model_evict(short)
            assert cache.evict(short) == expect
            event(f"request: evicted to make room ({'enough' if expect == short else 'not enough'})")
        try:
            if need > pool.num_free:
                free_before = pool.num_free
                with pytest.raises(OutOfPages):
                    pool.alloc(need)
                event("request: OutOfPages (locked pages fill the pool)")
                assert pool.num_free == free_before
                return
            new = pool.alloc(need)
            assert cache.insert(tokens, m.pages + new, ns) == m.num_tokens
            self.record_insert(ns, bids, len(held.prefix), new)
            assert pool.refcounts(new).tolist() == [2] * need  # the caller's and the tree's
            pool.decref(new)
        finally:
            self.locked.remove(held)
            cache.unlock(m)
        if keep:
            running = self.match(ns, bids, tail)
            cache.lock(running.match)
            self.locked.append(running)

    @rule(ns=NAMESPACES, bids=st.lists(st.integers(0, NUM_BLOCK_IDS - 1), max_size=6),
          tail=st.integers(0, 15), readonly=st.booleans())
    def serve_prompt(self, ns: Namespace, bids: list[int], tail: int, readonly: bool) -> None:
        """serve_prompt: `request`'s match -> lock -> evict -> alloc -> cache -> release in one
        call, the partial tail page only counted. The model does those steps one by one."""
        cache, pool, ps = self.cache, self.pool, self.PAGE_SIZE
        tokens = np.asarray(self.tokens(bids, tail), dtype=np.int32)
        if readonly:
            tokens.flags.writeable = False
        private = int(tail % ps != 0)
        prefix = self.model_match(ns, bids)
        self.touch(ns, prefix)
        need = len(bids) - len(prefix) + private
        ran = True
        if need > pool.num_free:
            held = Held(None, ns, prefix, None)  # the model's lock on the matched path
            self.locked.append(held)
            evictable = sum(1 for q, cached in self.model.items() for p in cached if not self.is_locked(q, p))
            ran = need <= pool.num_free + evictable
            if ran:
                self.model_evict(need - pool.num_free)
            self.locked.remove(held)
        hit, did_run, in_use = cache.serve_prompt(tokens, private, ns)
        assert (hit, did_run) == (len(prefix) * ps, ran)
        if not ran:
            event("serve_prompt: larger than the pool can give")
            return
        assert in_use == pool.num_used + private
        if len(bids) > len(prefix):
            contents = self.tree_contents()
            new = [contents[(ns, tuple(bids[:i]))] for i in range(len(prefix) + 1, len(bids) + 1)]
            self.record_insert(ns, bids, len(prefix), new)
        event(f"serve_prompt: {'evicted' if need > 0 and in_use == pool.num_pages else 'ran'}")

    def record_insert(self, ns: Namespace, bids: list[int], k: int, new: list[int]) -> None:
        """Model side of an insert of `bids` whose first k blocks were cached."""
        self.clock += 1
        cached = self.model.setdefault(ns, {})
        for i in range(1, len(bids) + 1):
            p = tuple(bids[:i])
            if i <= k:
                cached[p] = cached[p]._replace(last_use=self.clock)
            else:
                cached[p] = Cached(new[i - k - 1], self.clock, next(self.serials))

    def insert_without_match(self, ns: Namespace, bids: list[int], tokens) -> None:
        """Insert with pages chosen from the model alone (no match first): the tree must find
        what is cached itself, whatever the last match was."""
        cache, pool = self.cache, self.pool
        need = len(bids) - len(self.model_match(ns, bids))
        if need > pool.num_free:
            short = need - pool.num_free
            assert cache.evict(short) == self.model_evict(short)
            need = len(bids) - len(self.model_match(ns, bids))  # eviction may have hit our prefix
            if need > pool.num_free:
                return
        prefix = self.model_match(ns, bids)
        new = pool.alloc(need)
        assert cache.insert(tokens, self.model_pages(ns, prefix) + new, ns) == len(prefix) * self.PAGE_SIZE
        self.record_insert(ns, bids, len(prefix), new)
        pool.decref(new)

    @rule(ns=NAMESPACES, bids=st.lists(st.integers(0, NUM_BLOCK_IDS - 1), max_size=6),
          tail=st.integers(0, 15))
    def blind_insert(self, ns: Namespace, bids: list[int], tail: int) -> None:
        self.insert_without_match(ns, bids, self.tokens(bids, tail))

    @rule(ns=NAMESPACES, bids=st.lists(st.integers(0, NUM_BLOCK_IDS - 1), min_size=1, max_size=6),
          tail=st.integers(0, 15))
    def match_read_only(self, ns: Namespace, bids: list[int], tail: int) -> None:
        """A read-only match whose insert comes later, after whatever rules run in between."""
        tokens = self.tokens(bids, tail, readonly=True)
        self.match(ns, bids, tail, tokens)
        self.pending = (ns, bids, tokens)

    @precondition(lambda self: self.pending is not None)
    @rule()
    def insert_pending(self) -> None:
        ns, bids, tokens = self.pending
        self.pending = None
        self.insert_without_match(ns, bids, tokens)

    @rule(ns=NAMESPACES, bids=st.lists(st.integers(0, NUM_BLOCK_IDS - 1), max_size=6),
          tail=st.integers(0, 15))
    def match_only(self, ns: Namespace, bids: list[int], tail: int) -> None:
        held = self.match(ns, bids, tail)
        self.seen.append(held)
        del self.seen[:-16]
        self.earlier.append((ns, bids, held.match))
        del self.earlier[:-16]

    @precondition(lambda self: self.earlier)
    @rule(data=st.data(), more=st.lists(st.integers(0, NUM_BLOCK_IDS - 1), max_size=3),
          tail=st.integers(0, 15))
    def match_since(self, data: st.DataObject, more: list[int], tail: int) -> None:
        """match(since=an earlier match of the same leading tokens, which may have grown since):
        the model's answer whatever happened in between (stale, split, extended below, trimmed),
        with the same LRU refresh (the evict rules check the order against the model after)."""
        ns, bids, old = self.earlier[data.draw(st.integers(0, len(self.earlier) - 1))]
        bids = bids + more
        m = self.cache.match(self.tokens(bids, tail), ns, since=old)
        prefix = self.model_match(ns, bids)
        assert m.num_tokens == len(prefix) * self.PAGE_SIZE, f"since: {m.num_tokens} tokens, model {len(prefix)}"
        assert m.pages == self.model_pages(ns, prefix), "since: other pages than the model's"
        event(f"match(since=...): {'reused' if m is old else 'walked'}")
        self.touch(ns, prefix)
        self.seen.append(Held(m, ns, prefix, self.serial_of(ns, prefix)))
        del self.seen[:-16]

    @rule(ns=NAMESPACES, bids=st.lists(st.integers(0, NUM_BLOCK_IDS - 1), max_size=6))
    def lock(self, ns: Namespace, bids: list[int]) -> None:
        held = self.match(ns, bids, 0)
        locked_before = self.cache.num_locked_pages
        self.cache.lock(held.match)
        self.locked.append(held)
        newly = [p for p in (held.prefix[:i] for i in range(1, len(held.prefix) + 1))
                 if not any(h.ns == ns and h.prefix[: len(p)] == p for h in self.locked[:-1])]
        assert self.cache.num_locked_pages == locked_before + len(newly)

    @precondition(lambda self: self.locked)
    @rule(data=st.data())
    def unlock(self, data: st.DataObject) -> None:
        held = self.locked.pop(data.draw(st.integers(0, len(self.locked) - 1)))
        self.cache.unlock(held.match)

    @precondition(lambda self: self.locked)
    @rule(data=st.data(), more=st.lists(st.integers(0, NUM_BLOCK_IDS - 1), max_size=4),
          tail=st.integers(0, 15))
    def extend(self, data: st.DataObject, more: list[int], tail: int) -> None:
        """A chunk of a running prefill: cache the blocks after a locked match below it (some
        maybe cached by another request already) and move the lock to the longer match."""
        i = data.draw(st.integers(0, len(self.locked) - 1))
        held = self.locked[i]
        cache, pool, ns = self.cache, self.pool, held.ns
        bids = list(held.prefix) + more
        k = len(self.model_match(ns, bids))  # >= len(held.prefix): a locked path stays cached
        need = len(bids) - k
        if need > pool.num_free:
            short = need - pool.num_free
            assert cache.evict(short) == self.model_evict(short)
            k = len(self.model_match(ns, bids))
            need = len(bids) - k
            if need > pool.num_free:
                return
        new = pool.alloc(need)
        ours = self.model_pages(ns, tuple(bids[:k]))[len(held.prefix):] + new
        m = cache.extend(held.match, self.tokens(more, tail), ours)
        self.record_insert(ns, bids, k, new)
        pool.decref(new)
        assert m.num_tokens == len(bids) * self.PAGE_SIZE and m.pages_from == len(held.prefix)
        assert m.pages == self.model_pages(ns, tuple(bids))[len(held.prefix):]
        self.locked[i] = Held(m, ns, tuple(bids), self.serial_of(ns, tuple(bids)))
        event(f"extend: {'nothing new' if not more else 'some cached below' if k > len(held.prefix) else 'all new'}")

    @rule(ns=NAMESPACES, bids=st.lists(st.integers(0, NUM_BLOCK_IDS - 1), max_size=6))
    def extend_unlocked(self, ns: Namespace, bids: list[int]) -> None:
        """extend grows a locked match only: an unlocked one raises and changes nothing."""
        held = self.match(ns, bids, 0)
        if any(h.ns == ns and h.prefix == held.prefix for h in self.locked):
            return
        before = self.tree_contents()
        with pytest.raises(ValueError, match="unlocked"):
            self.cache.extend(held.match, self.tokens([0], 0), [0])
        assert self.tree_contents() == before

    @rule(ns=NAMESPACES, bids=st.lists(st.integers(0, NUM_BLOCK_IDS - 1), max_size=6))
    def unlock_unlocked(self, ns: Namespace, bids: list[int]) -> None:
        """unlock(m) undoes a lock taken on m's very path: with none there it raises and
        changes nothing, even while a longer locked match covers m's path."""
        held = self.match(ns, bids, 0)
        if any(h.ns == ns and h.prefix == held.prefix for h in self.locked):
            return
        covered = self.is_locked(ns, held.prefix) and held.prefix
        locked_before = self.cache.num_locked_pages
        event("unlock of a path locked only by longer matches" if covered else "unlock of an unlocked path")
        with pytest.raises(ValueError, match="unlocked"):
            self.cache.unlock(held.match)
        assert self.cache.num_locked_pages == locked_before

    @rule(ns=NAMESPACES, bids=st.lists(st.integers(0, NUM_BLOCK_IDS - 1), max_size=3),
          locked_there=st.booleans())
    def foreign_match(self, ns: Namespace, bids: list[int], locked_there: bool) -> None:
        """A match made by another cache (the same tokens cached there) is refused by lock
        and unlock here, changing nothing in either cache."""
        other = RadixCache(PagePool(4), page_size=self.PAGE_SIZE)
        tokens = self.tokens(bids, 0)
        pages = other.pool.alloc(len(bids))
        other.insert(tokens, pages, ns)
        theirs = other.match(tokens, ns)
        if locked_there:
            other.lock(theirs)
        locked_before = self.cache.num_locked_pages
        for op in (self.cache.lock, self.cache.unlock):
            with pytest.raises(ValueError, match="another RadixCache"):
                op(theirs)
        assert self.cache.num_locked_pages == locked_before
        assert other.num_locked_pages == (len(bids) if locked_there else 0)
        other.check_invariants()

    def lock_old(self, held: Held) -> None:
        """Lock a match taken some steps ago: stale (raises, changes nothing) exactly when its
        last block was evicted since, even if the same prefix was cached again."""
        stale = held.prefix and self.serial_of(held.ns, held.prefix) != held.last_serial
        locked_before = self.cache.num_locked_pages
        event(f"lock of an old match: {'stale' if stale else 'still valid'}")
        if stale:
            with pytest.raises(ValueError, match="stale"):
                self.cache.lock(held.match)
            assert self.cache.num_locked_pages == locked_before
        else:
            self.cache.lock(held.match)
            self.locked.append(held)
            assert held.match.pages == self.model_pages(held.ns, held.prefix)

    @precondition(lambda self: self.seen)
    @rule(data=st.data())
    def lock_old_match(self, data: st.DataObject) -> None:
        self.lock_old(self.seen.pop(data.draw(st.integers(0, len(self.seen) - 1))))

    @rule(ns=NAMESPACES, bids=st.lists(st.integers(0, NUM_BLOCK_IDS - 1), min_size=1, max_size=6),
          n=st.integers(1, 20))
    def match_evict_lock(self, ns: Namespace, bids: list[int], n: int) -> None:
        held = self.match(ns, bids, 0)
        self.evict(n)
        self.lock_old(held)

    @rule(n=st.integers(0, 20))
    def evict(self, n: int) -> None:
        evictable = self.cache.num_evictable_pages
        expect = self.model_evict(n)
        assert expect == min(n, evictable)
        event(f"evict: freed {'none' if expect == 0 else 'some' if expect < n else 'all asked'}")
        assert self.cache.evict(n) == expect

    # ---- invariants ----------------------------------------------------------------------
    @invariant()
    def tree_invariants(self) -> None:
        self.cache.check_invariants()

    @invariant()
    def namespaces_are_those_holding_something(self) -> None:
        """A namespace's root stays only while it holds a block or a lock (issue 33 item 7)."""
        want = {ns for ns, cached in self.model.items() if cached} | {h.ns for h in self.locked}
        assert set(self.cache.namespaces) == want

    @invariant()
    def tree_equals_model(self) -> None:
        model = {(ns, p): c.page for ns, cached in self.model.items() for p, c in cached.items()}
        assert self.tree_contents() == model
        cache, pool = self.cache, self.pool
        assert cache.num_cached_pages == len(model)
        assert cache.num_cached_pages == cache.num_evictable_pages + cache.num_locked_pages
        locked = sum(1 for ns, cached in self.model.items() for p in cached if self.is_locked(ns, p))
        assert cache.num_locked_pages == locked
        assert pool.num_free == pool.num_pages - len(model)  # between steps only the tree holds pages
        if model:
            assert (pool.refcounts(list(model.values())) == 1).all()

    def teardown(self) -> None:
        for held in self.locked:
            self.cache.unlock(held.match)
        self.cache.clear()
        self.cache.check_invariants()
        assert self.cache.num_cached_pages == 0
        assert self.pool.num_free == self.pool.num_pages  # invariant 6


class TreeMachinePage1(TreeMachine):
    PAGE_SIZE = 1
    NUM_PAGES = 9


class TreeMachinePage16(TreeMachine):
    PAGE_SIZE = 16
    NUM_PAGES = 12


class TreeMachineCollisions(TreeMachine):
    """Every block hashes alike: children are told apart only by comparing tokens."""

    PAGE_SIZE = 2
    NUM_PAGES = 10
    HASH_FN = staticmethod(lambda block: 0)


TestTreePage2 = TreeMachine.TestCase
TestTreePage1 = TreeMachinePage1.TestCase
TestTreePage16 = TreeMachinePage16.TestCase
TestTreeCollisions = TreeMachineCollisions.TestCase


# ---- the host tier (issue 37): demote / promote / host-evict ----------------------------------------
class CountingMover:
    """The tree's HostMover for TieredTreeMachine: counts the device-to-host copies asked for, and checks
    that none is of a block that still has its host copy."""

    def __init__(self) -> None:
        self.copied_down = 0
        self.cache: RadixCache | None = None

    def demote(self, gpu_pages: np.ndarray, host_pages: np.ndarray) -> None:
        self.copied_down += len(gpu_pages)
        asked = set(gpu_pages.tolist())
        stack = [self.cache.root(ns) for ns in self.cache.namespaces]
        while stack:
            node = stack.pop()
            stack.extend(node.iter_children())
            if asked & set(node.pages.tolist()):
                assert node.host is None, f"{node}: a device-to-host copy of a block with a host copy"

    def promote(self, host_pages: np.ndarray, gpu_pages: np.ndarray) -> None:
        pass


class TieredTreeMachine(RuleBasedStateMachine):
    """RadixCache with a host pool: requests (match -> lock -> promote the host part or not -> make room
    -> extend -> release), demotion (evict), host eviction, promotion of a held match, the evict -> load ->
    evict again cycle of one prefix, clear. A block is on "gpu", "host" or "both" tiers (loaded back, it
    keeps its host copy). After every step: check_invariants() (both pools, prefix-closed GPU residency,
    both LRU heaps, the both-tier list), a match equal to the tree's own contents (GPU or both-tier
    prefix, then the host-only part), the KV events per tier, and conservation: a demotion with host room
    (free pages plus copies) loses no block and copies only blocks without a host copy, a host eviction
    gives up copies before it forgets a block and takes no block off the GPU, a promotion moves blocks
    without losing any."""

    PAGE_SIZE = 2
    NUM_PAGES = 8
    HOST_PAGES = 6

    def __init__(self) -> None:
        super().__init__()
        from radixkv.cache.events import QueuePublisher
        from radixkv.cache.tree_host import HostPool

        self.pool = PagePool(self.NUM_PAGES)
        self.host_pool = HostPool(self.HOST_PAGES)
        self.events = QueuePublisher()
        self.cache = RadixCache(self.pool, page_size=self.PAGE_SIZE, host_pool=self.host_pool, events=self.events,
                                mover=CountingMover())
        self.cache.mover.cache = self.cache
        ps = self.PAGE_SIZE
        self.patterns = [([b % 2] * (ps - 1) + [b]) if ps > 1 else [b] for b in range(NUM_BLOCK_IDS)]
        self.block_of = {tuple(p): b for b, p in enumerate(self.patterns)}
        self.locked: list[MatchResult] = []
        self.blocks: dict[tuple[str, int], str] = {}  # (medium, chain hash) -> medium, from the events

    def tokens(self, bids: list[int]) -> np.ndarray:
        return np.array([t for b in bids for t in self.patterns[b]], dtype=np.int32)

    def contents(self) -> dict[tuple[Namespace, Prefix], str]:
        """(namespace, block prefix) -> "gpu" / "host" / "both", from a walk of the tree."""
        ps, out = self.PAGE_SIZE, {}
        for ns in self.cache.namespaces:
            stack: list = [(self.cache.root(ns), ())]
            while stack:
                node, prefix = stack.pop()
                for child in node.iter_children():
                    p = prefix
                    for i in range(len(child.key) // ps):
                        p = p + (self.block_of[tuple(child.key[i * ps:(i + 1) * ps].tolist())],)
                        out[(ns, p)] = "gpu" if child.host is None else "host" if child.host_only else "both"
                    stack.append((child, p))
        return out

    def expected_match(self, ns: Namespace, bids: list[int]) -> tuple[int, int]:
        c = self.contents()
        gpu = host = 0
        for k in range(1, len(bids) + 1):
            tier = c.get((ns, tuple(bids[:k])))
            if tier is None:
                break
            if tier != "host":
                assert host == 0, "a GPU block below a host-only block"
                gpu += 1
            else:
                host += 1
        return gpu, host

    def checked_match(self, ns: Namespace, bids: list[int]) -> MatchResult:
        gpu, host = self.expected_match(ns, bids)
        m = self.cache.match(self.tokens(bids), ns)
        ps = self.PAGE_SIZE
        assert (m.num_tokens, m.host_tokens) == (gpu * ps, host * ps), \
            f"match {m.num_tokens}+{m.host_tokens} tokens, tree holds {gpu * ps}+{host * ps}"
        assert len(m.pages) == gpu and sum(len(n.host) for n in m.host_path) == host
        return m

    @rule(ns=st.sampled_from([None, None, None, "a"]),
          bids=st.one_of(st.sampled_from([[0, 1, 2], [0, 1, 3], [0, 1, 2, 3], [0, 2], [1]]),
                         st.lists(st.integers(0, NUM_BLOCK_IDS - 1), max_size=5)),
          load=st.booleans(), keep=st.sampled_from([False, False, True]))
    def request(self, ns: Namespace, bids: list[int], load: bool, keep: bool) -> None:
        cache, pool, ps = self.cache, self.pool, self.PAGE_SIZE
        tokens = self.tokens(bids)
        m = self.checked_match(ns, bids)
        cache.lock(m)
        try:
            hb = m.host_tokens // ps if load else 0
            need = len(bids) - m.num_tokens // ps  # host blocks: loaded or computed again, a page each
            if need > pool.num_free + cache.num_evictable_pages:
                event("request: larger than the pool can give")
                return
            if need > pool.num_free:
                cache.evict(need - pool.num_free)
                now = cache.match(tokens, ns)
                m = m._replace(host_tokens=now.host_tokens, host_path=now.host_path)
                hb = min(hb, m.host_tokens // ps)
            if hb:
                before = self.contents()
                m = cache.promote(m, pool.alloc_array(hb), donate=True)
                event("request: loaded host blocks")
                after = self.contents()
                assert set(after) == set(before), "promote lost or added a block"
            rest = len(bids) - m.num_tokens // ps
            if rest:
                pages = pool.alloc(rest)
                m = cache.extend(m, tokens[m.num_tokens:], pages)
                pool.decref(pages)
        finally:
            if keep and len(self.locked) < 3:
                self.locked.append(m)
            else:
                cache.unlock(m)

    @rule(n=st.integers(0, 10))
    def demote(self, n: int) -> None:
        self.evict_checked(n)

    def evict_checked(self, n: int) -> int:
        """evict(n), checked: with room on host (free pages plus copies it may give up) no block is lost;
        with free host pages for every GPU-only block, a block that kept its host copy moves without a
        copy and every other one costs one (CountingMover checks no copy is of a block with a copy)."""
        cache = self.cache
        before = self.contents()
        host_room = self.host_pool.num_free + cache.num_host_copies
        gpu_before = cache.num_cached_pages
        evictable = cache.num_evictable_pages
        copied, saved, demoted = cache.mover.copied_down, cache.demotes_saved, cache.demoted_pages
        spare = self.host_pool.num_free >= sum(t == "gpu" for t in before.values())  # no copy need go
        freed = cache.evict(n)
        assert freed == min(n, evictable)
        assert cache.num_cached_pages == gpu_before - freed
        after = self.contents()
        if freed <= host_room:
            assert set(after) == set(before), "a demotion with host room dropped a block"
            event("demote: all kept on host" if freed else "demote: nothing")
        assert set(after) <= set(before)
        assert cache.mover.copied_down - copied == cache.demoted_pages - demoted
        went = [k for k, t in after.items() if t == "host" and before[k] != "host"]
        kept = sum(before[k] == "both" for k in went)
        if spare:
            assert cache.demotes_saved - saved == kept, "a block with a host copy was not demoted onto it"
            assert cache.demoted_pages - demoted == len(went) - kept
        if kept:
            event("demote: onto kept host copies")
        return freed

    @rule(n=st.integers(0, 8))
    def host_evict(self, n: int) -> None:
        """Copies go first (nothing forgotten), then host-only blocks; no block leaves the GPU."""
        before = self.contents()
        had, copies = self.cache.num_host_pages, self.cache.num_host_copies
        assert self.cache.evict_host(n) == min(n, had)
        after = self.contents()
        on_gpu = {k for k, t in before.items() if t != "host"}
        assert {k for k, t in after.items() if t != "host"} == on_gpu
        assert len(before) - len(after) == max(0, min(n, had) - copies)
        assert sum(t == "both" for t in after.values()) == max(0, copies - n)
        if copies and n:
            event("host_evict: gave up host copies")

    @rule(ns=st.sampled_from([None, "a"]), bids=st.sampled_from([[0, 1, 2], [0, 1, 3], [2, 3], [1]]))
    def evict_load_evict(self, ns: Namespace, bids: list[int]) -> None:
        """The multi-turn cycle: a prefix demoted, loaded back (both tiers), and demoted again with no
        second device-to-host copy while its host copy lasts."""
        cache, pool, ps = self.cache, self.pool, self.PAGE_SIZE
        tokens = self.tokens(bids)
        m = cache.match(tokens, ns)
        if m.host_tokens == 0:
            return
        loaded = cache.load(tokens, ns, m, m.host_tokens // ps)
        if loaded.num_tokens == m.num_tokens:
            return
        tiers = self.contents()
        back = [tuple(bids[:k]) for k in range(m.num_tokens // ps + 1, loaded.num_tokens // ps + 1)]
        assert all(tiers[(ns, p)] == "both" for p in back), "a loaded block gave up its host copy"
        spare = self.host_pool.num_free >= sum(t == "gpu" for t in tiers.values())  # no copy need go
        self.evict_checked(pool.num_pages)
        if spare and not self.locked:
            after = self.contents()
            assert all(after[(ns, p)] == "host" for p in back), "a loaded block was not demoted onto its copy"
            event("evict_load_evict: demoted again onto the copy")
    @precondition(lambda self: self.locked)
    @rule(data=st.data())
    def promote_held(self, data: st.DataObject) -> None:
        """Promote part of a held (locked) match's host part, if any is left below it."""
        i = data.draw(st.integers(0, len(self.locked) - 1))
        m = self.locked[i]
        k = data.draw(st.integers(0, 3))
        host = [n for n in m.host_path]
        if not host or any(n.host is None for n in host) or k == 0:
            return
        avail = sum(len(n.host) for n in host)
        k = min(k, avail, self.pool.num_free)
        if k == 0:
            return
        pages = self.pool.alloc_array(k)
        try:
            new = self.cache.promote(m, pages, donate=True)
        except ValueError as e:  # the host path changed under the held match: the pages are still ours
            assert "stale" in str(e)
            self.pool.decref_distinct(pages)
            return
        self.locked[i] = new
        event("promote_held")

    @precondition(lambda self: self.locked)
    @rule()
    def release(self) -> None:
        self.cache.unlock(self.locked.pop())

    @rule()
    def clear(self) -> None:
        self.cache.clear()
        assert self.cache.num_host_pages == 0
        assert self.cache.num_cached_pages == self.cache.num_locked_pages

    @invariant()
    def invariants(self) -> None:
        self.cache.check_invariants()
        c, cache = self.contents(), self.cache
        assert sum(t != "host" for t in c.values()) == cache.num_cached_pages
        assert sum(t != "gpu" for t in c.values()) == cache.num_host_pages == self.host_pool.num_used
        assert sum(t == "both" for t in c.values()) == cache.num_host_copies

    @invariant()
    def events_follow_tiers(self) -> None:
        """The KV events, applied in order keyed by (medium, hash), hold as many blocks per tier as the tree."""
        from radixkv.cache.events import AllBlocksCleared, BlockRemoved, BlockStored

        for e in self.events.drain().events:
            if isinstance(e, BlockStored):
                for h in e.block_hashes:
                    assert (e.medium, h) not in self.blocks
                    self.blocks[(e.medium, h)] = e.medium
            elif isinstance(e, BlockRemoved):
                for h in e.block_hashes:
                    del self.blocks[(e.medium, h)]
            elif isinstance(e, AllBlocksCleared):
                self.blocks.clear()
        gpu = sum(m == "GPU" for m in self.blocks.values())
        assert gpu == self.cache.num_cached_pages and len(self.blocks) - gpu == self.cache.num_host_pages
        c = self.contents()  # a block on both tiers is stored on both media
        both = {(ns, p) for (ns, p), t in c.items() if t == "both"}
        assert sum(1 for (m1, h) in self.blocks if m1 == "CPU" and ("GPU", h) in self.blocks) == len(both)

    def teardown(self) -> None:
        for m in self.locked:
            self.cache.unlock(m)
        self.cache.clear()
        self.cache.check_invariants()
        assert self.pool.num_free == self.pool.num_pages
        assert self.host_pool.num_free == self.host_pool.num_pages


class TieredTreeMachinePage1(TieredTreeMachine):
    PAGE_SIZE = 1
    NUM_PAGES = 6
    HOST_PAGES = 4


TestTieredTree = TieredTreeMachine.TestCase
TestTieredTreePage1 = TieredTreeMachinePage1.TestCase
