"""The response stores: the in-process one (bounded in bytes, TTL) and Redis (real Redis)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
import redis
import redis.asyncio

from sluicegate.conversation.record import StoredResponse
from sluicegate.conversation.store import MemoryResponseStore, RedisResponseStore, StoreConfig
from sluicegate.errors import StoreUnavailableError
from tests.support.clock import Clock
from tests.support.redis_server import shared_redis_url

CONFIG = StoreConfig(ttl=60, max_entry_bytes=10_000)


def record(text: str = "hello", response_id: str | None = None) -> StoredResponse:
    response = {
        "id": response_id or f"resp_{uuid.uuid4().hex}",
        "object": "response",
        "output": [{"type": "message", "role": "assistant", "content": [{"text": text}]}],
    }
    return StoredResponse(response, [{"type": "message", "role": "user", "content": "hi"}])


def test_a_record_continues_as_its_input_then_its_output() -> None:
    stored = record("A")
    assert StoredResponse.decode(stored.encode()) == stored
    assert stored.conversation() == [*stored.items, *stored.response["output"]]


async def test_memory_store_keeps_each_keys_responses_apart() -> None:
    store = MemoryResponseStore(CONFIG, max_bytes=100_000)
    stored = record()
    assert await store.put("key-a", stored)
    assert await store.get("key-a", stored.id) == stored
    assert await store.get("key-b", stored.id) is None
    assert not await store.delete("key-b", stored.id)
    assert await store.delete("key-a", stored.id)
    assert await store.get("key-a", stored.id) is None


async def test_memory_store_is_bounded_in_bytes_dropping_the_least_recent() -> None:
    first = record("x" * 400)
    size = len(first.encode())
    store = MemoryResponseStore(CONFIG, max_bytes=3 * size + 10)
    records = [first, *(record("x" * 400) for _ in range(3))]
    for r in records:
        await store.put("k", r)
    assert store.size_bytes <= 3 * size + 10
    assert await store.get("k", first.id) is None  # the oldest went
    assert all([await store.get("k", r.id) == r for r in records[1:]])


async def test_a_record_larger_than_the_entry_bound_is_not_stored() -> None:
    store = MemoryResponseStore(StoreConfig(ttl=60, max_entry_bytes=200), max_bytes=100_000)
    big = record("x" * 500)
    assert not await store.put("k", big)
    assert await store.get("k", big.id) is None


async def test_memory_store_entries_expire() -> None:
    clock = Clock(0.0)
    store = MemoryResponseStore(CONFIG, max_bytes=100_000, clock=clock)
    stored = record()
    await store.put("k", stored)
    clock.now = 59.0
    assert await store.get("k", stored.id) == stored
    clock.now = 60.5
    assert await store.get("k", stored.id) is None


@pytest.fixture
async def client() -> AsyncIterator[redis.asyncio.Redis]:
    c = redis.asyncio.Redis.from_url(shared_redis_url())
    yield c
    await c.aclose()


async def test_redis_store_keeps_responses_per_key_with_the_ttl(
    client: redis.asyncio.Redis, prefix: str
) -> None:
    store = RedisResponseStore(client, CONFIG, prefix=prefix)
    stored = record()
    assert await store.put("key-a", stored)
    assert await store.get("key-a", stored.id) == stored
    assert await store.get("key-b", stored.id) is None
    ttl = await client.pttl(store.key("key-a", stored.id))
    assert 55_000 < ttl <= 60_000
    assert not await store.delete("key-b", stored.id)
    assert await store.delete("key-a", stored.id)
    assert await store.get("key-a", stored.id) is None


async def test_redis_store_is_read_by_another_client(prefix: str) -> None:
    """What one gateway process stores, another (a replica, or after a restart) reads."""
    first = redis.asyncio.Redis.from_url(shared_redis_url())
    stored = record()
    await RedisResponseStore(first, CONFIG, prefix=prefix).put("k", stored)
    await first.aclose()
    second = redis.asyncio.Redis.from_url(shared_redis_url())
    assert await RedisResponseStore(second, CONFIG, prefix=prefix).get("k", stored.id) == stored
    await second.aclose()


async def test_redis_store_refuses_a_record_over_the_entry_bound(
    client: redis.asyncio.Redis, prefix: str
) -> None:
    store = RedisResponseStore(client, StoreConfig(ttl=60, max_entry_bytes=200), prefix=prefix)
    big = record("x" * 500)
    assert not await store.put("k", big)
    assert await client.exists(store.key("k", big.id)) == 0


async def test_a_corrupt_entry_reads_as_absent(client: redis.asyncio.Redis, prefix: str) -> None:
    store = RedisResponseStore(client, CONFIG, prefix=prefix)
    await client.set(store.key("k", "resp_bad"), b"{not json")
    assert await store.get("k", "resp_bad") is None


async def test_redis_down_is_store_unavailable() -> None:
    down = redis.asyncio.Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.2)
    store = RedisResponseStore(down, CONFIG, op_timeout=0.5)
    with pytest.raises(StoreUnavailableError):
        await store.get("k", "resp_1")
    with pytest.raises(StoreUnavailableError):
        await store.put("k", record())
    await down.aclose()


# ---- the bound per key -----------------------------------------------------------------

SIZE = len(record("x" * 400).encode())
KEY_BOUND = StoreConfig(ttl=60, max_entry_bytes=10_000, max_key_bytes=3 * SIZE)
"""Three records of `SIZE` bytes per key."""


def records(n: int) -> list[StoredResponse]:
    return [record("x" * 400) for _ in range(n)]


async def test_memory_store_a_key_past_its_bound_loses_its_own_oldest_not_another_keys() -> None:
    store = MemoryResponseStore(KEY_BOUND, max_bytes=100 * SIZE)
    kept = records(2)
    for r in kept:
        assert await store.put("key-b", r)
    mine = records(10)
    for r in mine:
        assert await store.put("key-a", r)
    assert [await store.get("key-b", r.id) for r in kept] == kept
    found = [await store.get("key-a", r.id) is not None for r in mine]
    assert found == [False] * 7 + [True] * 3  # the oldest went first
    assert store.key_bytes("key-a") == 3 * SIZE and store.key_bytes("key-b") == 2 * SIZE
    assert store.size_bytes == 5 * SIZE


async def test_memory_store_past_its_whole_bound_the_largest_holder_loses_its_oldest() -> None:
    store = MemoryResponseStore(KEY_BOUND, max_bytes=5 * SIZE)
    big, small = records(3), records(2)
    for r in big:
        await store.put("key-a", r)
    for r in small:
        await store.put("key-b", r)
    newcomer = record("x" * 400)
    assert await store.put("key-c", newcomer)
    assert await store.get("key-a", big[0].id) is None
    assert [await store.get("key-a", r.id) for r in big[1:]] == big[1:]
    assert [await store.get("key-b", r.id) for r in small] == small
    assert await store.get("key-c", newcomer.id) == newcomer
    assert store.size_bytes == 5 * SIZE


async def test_memory_store_accounting_follows_deletes_and_rewrites() -> None:
    store = MemoryResponseStore(KEY_BOUND, max_bytes=100 * SIZE)
    first, second = records(2)
    await store.put("k", first)
    await store.put("k", first)  # the same id again replaces it
    await store.put("k", second)
    assert store.key_bytes("k") == 2 * SIZE
    assert await store.delete("k", first.id) and await store.delete("k", second.id)
    assert store.key_bytes("k") == 0 and store.size_bytes == 0


async def test_a_record_larger_than_the_key_bound_is_not_taken() -> None:
    config = StoreConfig(ttl=60, max_entry_bytes=10_000, max_key_bytes=SIZE - 1)
    store = MemoryResponseStore(config, max_bytes=100 * SIZE)
    big = record("x" * 400)
    assert not store.takes(SIZE) and not await store.put("k", big)
    assert store.size_bytes == 0


async def redis_state(
    client: redis.asyncio.Redis, store: RedisResponseStore, key_id: str
) -> tuple[list[str], int, int]:
    """The key's ids by write time, its byte total, and the bytes its records hold."""
    ids_key, _, total_key = store.bookkeeping(key_id)
    ids = [i.decode() for i in await client.zrange(ids_key, 0, -1)]
    total = int(await client.get(total_key) or 0)
    held = sum([await client.strlen(store.key(key_id, i)) for i in ids])
    return ids, total, held


async def test_redis_store_a_key_past_its_bound_loses_its_own_oldest_not_another_keys(
    client: redis.asyncio.Redis, prefix: str
) -> None:
    store = RedisResponseStore(client, KEY_BOUND, prefix=prefix)
    kept = records(2)
    for r in kept:
        assert await store.put("key-b", r)
    mine = records(10)
    for r in mine:
        assert await store.put("key-a", r)
    assert [await store.get("key-b", r.id) for r in kept] == kept
    found = [await store.get("key-a", r.id) is not None for r in mine]
    assert found == [False] * 7 + [True] * 3  # the oldest went first
    ids, total, held = await redis_state(client, store, "key-a")
    assert ids == [r.id for r in mine[-3:]] and total == held == 3 * SIZE
    for name in [*store.bookkeeping("key-a"), store.key("key-a", mine[-1].id)]:
        assert 55_000 < await client.pttl(name) <= 60_000  # the bookkeeping lives as long


async def test_redis_store_keeps_the_bound_with_replicas_writing_at_once(prefix: str) -> None:
    """Two clients (two replicas) writing one key's records concurrently: the total always
    matches the records kept, and never passes the bound."""
    first = redis.asyncio.Redis.from_url(shared_redis_url())
    second = redis.asyncio.Redis.from_url(shared_redis_url())
    stores = [RedisResponseStore(c, KEY_BOUND, prefix=prefix) for c in (first, second)]
    written = records(40)
    await asyncio.gather(*(stores[i % 2].put("k", r) for i, r in enumerate(written)))
    ids, total, held = await redis_state(first, stores[0], "k")
    assert len(ids) == 3 and total == held == 3 * SIZE
    await first.aclose()
    await second.aclose()


async def test_redis_store_forgets_expired_records_when_the_key_writes_again(
    client: redis.asyncio.Redis, prefix: str
) -> None:
    store = RedisResponseStore(
        client, StoreConfig(ttl=0.2, max_entry_bytes=10_000, max_key_bytes=3 * SIZE), prefix=prefix
    )
    old, new = records(2)
    await store.put("k", old)
    await asyncio.sleep(0.3)
    await store.put("k", new)
    ids, total, held = await redis_state(client, store, "k")
    assert ids == [new.id] and total == held == SIZE


async def test_redis_store_delete_keeps_the_accounting(
    client: redis.asyncio.Redis, prefix: str
) -> None:
    store = RedisResponseStore(client, KEY_BOUND, prefix=prefix)
    first, second = records(2)
    await store.put("k", first)
    await store.put("k", second)
    assert await store.delete("k", first.id)
    assert not await store.delete("k", first.id)
    ids, total, held = await redis_state(client, store, "k")
    assert ids == [second.id] and total == held == SIZE
    assert await store.delete("k", second.id)
    assert await client.exists(*store.bookkeeping("k")) == 0


async def test_redis_store_names_keys_by_key_id_with_a_hash_tag(
    client: redis.asyncio.Redis, prefix: str
) -> None:
    """Every key of one API key in one Redis Cluster slot, as the scripts need."""
    store = RedisResponseStore(client, KEY_BOUND, prefix=prefix)
    stored = record()
    await store.put("key-0123456789ab", stored)
    names = sorted(k.decode() for k in await client.keys(f"{prefix}*"))
    assert names == sorted(
        [
            f"{prefix}:response:{{key-0123456789ab}}:{stored.id}",
            f"{prefix}:responses:{{key-0123456789ab}}:ids",
            f"{prefix}:responses:{{key-0123456789ab}}:sizes",
            f"{prefix}:responses:{{key-0123456789ab}}:bytes",
        ]
    )


async def test_redis_store_still_reads_and_deletes_records_stored_before_the_bound(
    client: redis.asyncio.Redis, prefix: str
) -> None:
    store = RedisResponseStore(client, KEY_BOUND, prefix=prefix)
    stored = record()
    await client.set(f"{prefix}:response:k:{stored.id}", stored.encode(), px=60_000)
    assert await store.get("k", stored.id) == stored
    assert await store.delete("k", stored.id)
    assert await store.get("k", stored.id) is None
