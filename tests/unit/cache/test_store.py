"""The in-process memory store: bounded in bytes, LRU, expiring."""

from __future__ import annotations

from sluicegate.cache.store import MemoryStore


async def test_memory_store_is_bounded_in_bytes_and_evicts_least_recently_used() -> None:
    store = MemoryStore(max_bytes=1000)
    for i in range(10):
        await store.set(f"k{i}", b"x" * 198, ttl_ms=60_000)  # 200 bytes with the key
        assert store.size_bytes <= 1000
    assert len(store) == 5 and await store.get("k4") is None
    assert await store.get("k5") is not None  # now the most recently used
    await store.set("k10", b"x" * 197, ttl_ms=60_000)
    assert await store.get("k5") is not None and await store.get("k6") is None
    await store.set("huge", b"x" * 2000, ttl_ms=60_000)
    assert await store.get("huge") is None and store.size_bytes <= 1000


async def test_memory_store_expires_entries() -> None:
    now = [100.0]
    store = MemoryStore(max_bytes=1000, clock=lambda: now[0])
    await store.set("k", b"v", ttl_ms=1500)
    now[0] += 1.4
    assert await store.get("k") == b"v"
    now[0] += 0.2
    assert await store.get("k") is None and store.size_bytes == 0
