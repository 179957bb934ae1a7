"""The bounded LRU that the memos and the in-process cache store build on: what it drops, in
which order, and the size it accounts."""

from __future__ import annotations

from sluicegate.lru import BoundedLRU


def test_past_max_entries_the_least_recently_used_goes_first() -> None:
    lru: BoundedLRU[str, int] = BoundedLRU(max_entries=2)
    lru.put("a", 1)
    lru.put("b", 2)
    assert lru.get("a") == 1  # "a" now the most recent: "b" is the oldest
    lru.put("c", 3)
    assert "b" not in lru
    assert (lru.get("a"), lru.get("c"), len(lru)) == (1, 3, 2)


def test_past_max_size_old_entries_go_until_the_sizes_fit() -> None:
    lru: BoundedLRU[str, str] = BoundedLRU(max_size=10)
    lru.put("a", "x", size=4)
    lru.put("b", "y", size=4)
    lru.put("c", "z", size=6)  # 14: "a" goes (10), and the sum fits
    assert "a" not in lru and "b" in lru and "c" in lru
    assert lru.size == 10
    lru.put("d", "w", size=9)  # only "d" fits
    assert ("b" in lru, "c" in lru, lru.get("d"), lru.size) == (False, False, "w", 9)


def test_a_value_larger_than_the_bound_is_not_kept_and_its_older_value_goes() -> None:
    lru: BoundedLRU[str, str] = BoundedLRU(max_size=10)
    lru.put("a", "small", size=3)
    lru.put("b", "other", size=3)
    lru.put("a", "huge", size=11)
    assert "a" not in lru and lru.get("a") is None
    assert lru.get("b") == "other"
    assert lru.size == 3, "the dropped value's size is still counted"


def test_putting_a_key_again_replaces_its_value_and_its_size() -> None:
    lru: BoundedLRU[str, str] = BoundedLRU(max_entries=2, max_size=100)
    lru.put("a", "one", size=30)
    lru.put("a", "two", size=50)
    assert (lru.get("a"), len(lru), lru.size) == ("two", 1, 50)


def test_pop_and_clear_give_the_size_back() -> None:
    lru: BoundedLRU[str, int] = BoundedLRU(max_size=100)
    lru.put("a", 1, size=30)
    lru.put("b", 2, size=20)
    assert lru.pop("a") == 1 and lru.pop("a") is None
    assert lru.size == 20
    lru.clear()
    assert (len(lru), lru.size, lru.get("b")) == (0, 0, None)


def test_a_stored_none_and_a_falsy_value_are_told_from_a_miss_by_membership() -> None:
    lru: BoundedLRU[str, int] = BoundedLRU(max_entries=2)
    lru.put("zero", 0)
    assert lru.get("zero") == 0 and "zero" in lru
    assert lru.get("absent") is None and "absent" not in lru


def test_without_bounds_nothing_is_dropped() -> None:
    lru: BoundedLRU[int, int] = BoundedLRU()
    for i in range(1000):
        lru.put(i, i, size=1_000_000)
    assert len(lru) == 1000 and lru.get(0) == 0
