"""The response stores: the in-process one (bounded in bytes, TTL) and Redis (real Redis)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
import redis
import redis.asyncio

from sluicegate.conversation.record import StoredResponse
from sluicegate.conversation.store import MemoryResponseStore, RedisResponseStore, StoreConfig
from sluicegate.errors import StoreUnavailableError
from tests.unit.conftest import REDIS_URL

CONFIG = StoreConfig(ttl=60, max_entry_bytes=10_000)


def record(text: str = "hello", response_id: str | None = None) -> StoredResponse:
    response = {
        "id": response_id or f"resp_{uuid.uuid4().hex}",
        "object": "response",
        "output": [{"type": "message", "role": "assistant", "content": [{"text": text}]}],
    }
    return StoredResponse(response, [{"type": "message", "role": "user", "content": "hi"}])


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


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
    clock = Clock()
    store = MemoryResponseStore(CONFIG, max_bytes=100_000, clock=clock)
    stored = record()
    await store.put("k", stored)
    clock.now = 59.0
    assert await store.get("k", stored.id) == stored
    clock.now = 60.5
    assert await store.get("k", stored.id) is None


@pytest.fixture
async def client() -> AsyncIterator[redis.asyncio.Redis]:
    c = redis.asyncio.Redis.from_url(REDIS_URL)
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
    ttl = await client.pttl(f"{prefix}:response:key-a:{stored.id}")
    assert 55_000 < ttl <= 60_000
    assert not await store.delete("key-b", stored.id)
    assert await store.delete("key-a", stored.id)
    assert await store.get("key-a", stored.id) is None


async def test_redis_store_is_read_by_another_client(prefix: str) -> None:
    """What one gateway process stores, another (a replica, or after a restart) reads."""
    first = redis.asyncio.Redis.from_url(REDIS_URL)
    stored = record()
    await RedisResponseStore(first, CONFIG, prefix=prefix).put("k", stored)
    await first.aclose()
    second = redis.asyncio.Redis.from_url(REDIS_URL)
    assert await RedisResponseStore(second, CONFIG, prefix=prefix).get("k", stored.id) == stored
    await second.aclose()


async def test_redis_store_refuses_a_record_over_the_entry_bound(
    client: redis.asyncio.Redis, prefix: str
) -> None:
    store = RedisResponseStore(client, StoreConfig(ttl=60, max_entry_bytes=200), prefix=prefix)
    big = record("x" * 500)
    assert not await store.put("k", big)
    assert await client.exists(f"{prefix}:response:k:{big.id}") == 0


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
