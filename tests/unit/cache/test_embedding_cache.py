"""The embedding cache alone: its entries, its keys, the store's batch reads and writes on a
real Redis (the test process's own), and a batch's single flight."""

from __future__ import annotations

import asyncio

import pytest

from sluicegate.cache.embedding_cache import (
    EmbeddingCache,
    EmbeddingCacheConfig,
    decode_embedding,
    encode_embedding,
)
from sluicegate.cache.store import MemoryStore, RedisStore
from sluicegate.engine.protocol import Embedding, Prompt
from sluicegate.wiring import redis_client
from tests.support.redis_server import shared_redis_url


def test_an_entry_keeps_the_vector_as_float32_and_its_tokens() -> None:
    embedding = Embedding([0.25, -1.5, 3.0], 7)
    assert decode_embedding(encode_embedding(embedding)) == embedding
    with pytest.raises(ValueError):
        decode_embedding(b"\x00\x01")


def test_keys_differ_by_weights_input_dimensions_truncation_and_namespace() -> None:
    cache = EmbeddingCache(MemoryStore(1 << 20))
    base = cache.key("m", "w1", "hello", None, None)
    variants = [
        cache.key("m", "w2", "hello", None, None),
        cache.key("m", "w1", "hello!", None, None),
        cache.key("m", "w1", [1, 2], None, None),
        cache.key("m", "w1", "hello", 64, None),
        cache.key("m", "w1", "hello", None, 10),
        cache.key("m", "w1", "hello", None, None, "key-abc"),
    ]
    assert len({base, *variants}) == 7
    assert base.startswith("sluicegate:emb:v1:m:")


async def test_the_redis_store_reads_and_writes_a_batch_in_one_round_trip() -> None:
    client = redis_client(shared_redis_url(), 4)
    try:
        store = RedisStore(client, op_timeout=1.0)
        await store.set_many([("emb-test:a", b"1"), ("emb-test:b", b"22")], 60_000)
        assert await store.get_many(["emb-test:a", "emb-test:none", "emb-test:b"]) == [
            b"1",
            None,
            b"22",
        ]
    finally:
        await client.aclose()


async def test_a_batch_computes_what_is_missing_once_and_keeps_it() -> None:
    cache = EmbeddingCache(MemoryStore(1 << 20), EmbeddingCacheConfig(per_key=True))
    calls: list[list[list[int]]] = []

    async def compute(prompts: list[Prompt]) -> list[Embedding]:
        calls.append([p.ids for p in prompts])
        return [Embedding([float(sum(p.ids))], len(p.ids)) for p in prompts]

    inputs: list[str | list[int]] = [[1], [2], [1]]
    batch = cache.batch("m", "w", inputs, None, None, "key-a")
    await batch.look_up()
    assert batch.outcome == "MISS"
    missing, positions = batch.missing()
    assert missing == [[1], [2]] and positions == [0, 1]
    result = await batch.compute([Prompt([1]), Prompt([2])], compute)
    assert [e.vector for e in result] == [[1.0], [2.0], [1.0]]
    await cache.close()  # the background write has happened
    again = cache.batch("m", "w", inputs, None, None, "key-a")
    await again.look_up()
    assert again.outcome == "HIT" and again.cached_tokens() == 3
    other_key = cache.batch("m", "w", inputs, None, None, "key-b")
    await other_key.look_up()
    assert other_key.outcome == "MISS"  # apart per API key
    other_key.abandon()


async def test_a_follower_computes_itself_when_its_leader_fails() -> None:
    cache = EmbeddingCache(MemoryStore(1 << 20))
    started = asyncio.Event()

    async def failing(prompts: list[Prompt]) -> list[Embedding]:
        started.set()
        await asyncio.sleep(0.05)
        raise RuntimeError("engine gone")

    async def working(prompts: list[Prompt]) -> list[Embedding]:
        return [Embedding([9.0], 1) for _ in prompts]

    leader = cache.batch("m", "w", ["same"], None, None, "")
    await leader.look_up()
    follower = cache.batch("m", "w", ["same"], None, None, "")
    await follower.look_up()
    assert follower.missing() == (["same"], [0])
    led = asyncio.create_task(leader.compute([Prompt([1])], failing))
    await started.wait()
    result = await follower.compute([Prompt([1])], working)
    assert result[0].vector == [9.0]
    with pytest.raises(RuntimeError, match="engine gone"):
        await led
