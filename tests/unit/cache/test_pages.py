"""PagePool: all-or-nothing alloc, reference counts, and bad frees that change nothing."""
from __future__ import annotations

import numpy as np
import pytest

from radixkv import OutOfPages, PagePool


def _state(pool: PagePool) -> tuple[int, list[int]]:
    return pool.num_free, pool.refcounts(range(pool.num_pages)).tolist()


def test_alloc_gives_distinct_held_pages_and_counts() -> None:
    pool = PagePool(8)
    a = pool.alloc(3)
    b = pool.alloc(2)
    assert isinstance(a, list) and all(isinstance(p, int) for p in a)
    assert len(set(a + b)) == 5 and all(0 <= p < 8 for p in a + b)
    assert pool.num_free == 3 and pool.num_used == 5
    assert [pool.refcount(p) for p in a + b] == [1] * 5
    assert pool.alloc(0) == [] and pool.num_free == 3
    pool.check_invariants()


def test_alloc_is_all_or_nothing_and_names_asked_and_free() -> None:
    pool = PagePool(4)
    pool.alloc(3)
    before = _state(pool)
    with pytest.raises(OutOfPages) as err:
        pool.alloc(2)
    assert err.value.requested == 2 and err.value.free == 1
    assert "2" in str(err.value) and "1 free" in str(err.value)
    assert _state(pool) == before
    assert isinstance(err.value, RuntimeError)
    with pytest.raises(ValueError, match="-1"):
        pool.alloc(-1)
    assert _state(pool) == before


def test_decref_to_zero_frees_and_returns_freed_count() -> None:
    pool = PagePool(4)
    pages = pool.alloc(3)
    pool.incref(pages[:1])
    assert pool.refcount(pages[0]) == 2
    assert pool.decref(pages) == 2  # pages[0] still has one reference
    assert pool.num_free == 3 and pool.refcount(pages[0]) == 1
    assert pool.decref([pages[0]]) == 1
    assert pool.num_free == 4
    pool.check_invariants()
    # freed pages are handed out again
    assert sorted(pool.alloc(4)) == [0, 1, 2, 3]


def test_incref_and_decref_count_a_page_listed_twice_twice() -> None:
    pool = PagePool(3)
    (p,) = pool.alloc(1)
    pool.incref([p, p])
    assert pool.refcount(p) == 3
    assert pool.decref([p, p]) == 0 and pool.refcount(p) == 1
    assert pool.decref(np.array([p])) == 1
    pool.check_invariants()


def test_double_free_names_the_page_and_changes_nothing() -> None:
    pool = PagePool(5)
    a, b, c = pool.alloc(3)
    pool.decref([c])
    before = _state(pool)
    with pytest.raises(ValueError, match=f"page {c}"):
        pool.decref([a, b, c])  # c is already free: a and b must keep their reference
    assert _state(pool) == before
    with pytest.raises(ValueError, match=f"page {a}"):
        pool.decref([a, a])  # one reference, dropped twice
    assert _state(pool) == before
    pool.check_invariants()


def test_incref_of_a_free_page_raises_and_changes_nothing() -> None:
    pool = PagePool(4)
    a, b = pool.alloc(2)
    free_page = next(p for p in range(4) if p not in (a, b))
    before = _state(pool)
    with pytest.raises(ValueError, match=f"free page {free_page}"):
        pool.incref([a, free_page])
    assert _state(pool) == before


@pytest.mark.parametrize("bad", [-1, 4, 100])
def test_pages_outside_the_pool_raise(bad: int) -> None:
    pool = PagePool(4)
    pages = pool.alloc(2)
    before = _state(pool)
    for op in (pool.incref, pool.decref, pool.refcounts):
        with pytest.raises(IndexError, match=f"page {bad}"):
            op([pages[0], bad])
    with pytest.raises(IndexError):
        pool.refcount(bad)
    assert _state(pool) == before


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        PagePool(-1)
    pool = PagePool(4)
    with pytest.raises(ValueError, match="flat"):
        pool.incref(np.zeros((2, 2), dtype=np.int64))
    with pytest.raises(ValueError, match="integer"):
        pool.decref(np.array([0.5]))


def test_empty_pool_and_empty_lists() -> None:
    pool = PagePool(0)
    assert pool.num_free == 0 and pool.alloc(0) == []
    with pytest.raises(OutOfPages):
        pool.alloc(1)
    pool.incref([])
    assert pool.decref([]) == 0
    pool.check_invariants()


def test_check_invariants_catches_a_corrupted_free_list() -> None:
    pool = PagePool(4)
    pool.alloc(1)
    pool._refs[3] = 1  # page 3 is on the free list and held: corrupt on purpose
    with pytest.raises(AssertionError, match="page 3"):
        pool.check_invariants()


def test_alloc_array_is_alloc_as_an_owned_int32_array() -> None:
    a, b = PagePool(8), PagePool(8)
    arr = a.alloc_array(3)
    assert arr.dtype == np.int32 and arr.tolist() == b.alloc(3)
    a.decref_distinct(arr[:1])  # a free pushes onto the stack the array was taken from
    assert a.alloc_array(1).tolist() == [arr[0]] and arr.tolist() == b.alloc(0) + [0, 1, 2]
    with pytest.raises(OutOfPages):
        a.alloc_array(6)
    assert a.num_free == 5
    a.check_invariants()
