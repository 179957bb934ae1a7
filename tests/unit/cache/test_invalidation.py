"""The near cache kept true by Redis: two gateways (the fake engine, real HTTP) on a Redis
of the module's own, which is changed behind their backs, killed, restarted and frozen; and
the bound in bytes under 100,000 distinct keys."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from typing import Any

import httpx
import pytest
import redis

from sluicegate.cache.entry import decode_entry, encode_entry
from sluicegate.cache.invalidation import InvalidationListener
from sluicegate.cache.near import NearCache
from sluicegate.cache.response_cache import CacheConfig, ResponseCache
from sluicegate.cache.store import RedisStore
from sluicegate.cache.ttl import TtlPolicy, TtlRule
from sluicegate.observability.metrics import CACHE_NEAR_INVALIDATIONS, CACHE_NEAR_REQUESTS
from sluicegate.wiring import redis_client
from tests.support.fakes import FakeEngine, fake_app, fake_completion, greedy_chat, serve_in_thread
from tests.support.redis_server import (
    RedisProcess,
    cache_entries,
    running_redis,
    written_cache_entries,
)

MAX_LAG = 0.3
PREFIX = "near"
# A change made through one gateway or in Redis is seen by the other within a few
# milliseconds (bench/latency_probes.py measures it); this only catches one that is not seen
# at all, or seen so late that a user would be served stale answers for seconds.
STALE_BOUND_S = 2.0


def near_hits() -> float:
    return CACHE_NEAR_REQUESTS.labels(outcome="hit")._value.get()


def near_invalidations() -> float:
    return CACHE_NEAR_INVALIDATIONS._value.get()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    with running_redis(tmp_path_factory.mktemp("redis")) as process:
        yield process


@pytest.fixture
def raw(server: RedisProcess) -> Iterator[redis.Redis]:
    client = redis.Redis(port=server.port, socket_timeout=5)
    client.flushdb()
    yield client
    client.close()


class Gateway:
    def __init__(self, client: httpx.AsyncClient, engine: FakeEngine) -> None:
        self.client = client
        self.engine = engine

    async def ask(self, body: dict[str, Any], **headers: str) -> tuple[str, str, float]:
        """X-Cache, the answer's text, and how many near-cache hits it made."""
        before = near_hits()
        response = await self.client.post("/v1/chat/completions", json=body, headers=headers)
        assert response.status_code == 200, response.text
        text = response.json()["choices"][0]["message"]["content"]
        return response.headers["x-cache"], text, near_hits() - before


@pytest.fixture
async def gateways(server: RedisProcess, raw: redis.Redis) -> AsyncIterator[list[Gateway]]:
    settings = {
        "redis_url": server.url,
        "redis_key_prefix": PREFIX,
        "cache_redis_timeout": 0.25,
        "cache_retry_interval": 0.1,
        "cache_near_max_lag": MAX_LAG,
    }
    async with AsyncExitStack() as stack:
        found = []
        for _ in range(2):
            engine = FakeEngine(words=["Hello", " there"])
            url = stack.enter_context(serve_in_thread(fake_app(engine, **settings)))
            client = await stack.enter_async_context(httpx.AsyncClient(base_url=url, timeout=30))
            found.append(Gateway(client, engine))
        yield found


async def near_hit_on(gateway: Gateway, body: dict[str, Any], within: float = 10.0) -> str:
    """Ask until the answer comes from the gateway's near cache; its text."""
    deadline = time.monotonic() + within
    while True:
        outcome, text, hits = await gateway.ask(body)
        if hits:
            assert outcome == "HIT"
            return text
        assert time.monotonic() < deadline, "no near-cache hit"
        await asyncio.sleep(0.02)


async def first_change(gateway: Gateway, body: dict[str, Any], old: str) -> float:
    """Seconds until the gateway stops answering `old` from its near cache; fails if it still
    does after `STALE_BOUND_S`."""
    started = time.monotonic()
    invalidations = near_invalidations()
    stale = 0
    while True:
        asked = time.monotonic()
        outcome, text, _ = await gateway.ask(body)
        if text != old or outcome != "HIT":
            return time.monotonic() - started
        stale += 1
        assert asked - started < STALE_BOUND_S, (
            f"{old!r} still served from the near cache {asked - started:.2f} s after the change "
            f"({stale} stale answers); near-cache invalidations counted meanwhile (both "
            f"gateways): {near_invalidations() - invalidations:g}"
        )


async def test_both_gateways_hit_and_a_replacement_through_one_reaches_the_other(
    gateways: list[Gateway],
) -> None:
    a, b = gateways
    assert (await a.ask(greedy_chat()))[:2] == ("MISS", "Hello there")
    assert await near_hit_on(a, greedy_chat()) == "Hello there"
    assert await near_hit_on(b, greedy_chat()) == "Hello there"

    a.engine.words = ["Fresh", " words"]
    outcome, text, _ = await a.ask(greedy_chat(), **{"cache-control": "no-cache"})
    assert (outcome, text) == ("BYPASS", "Fresh words")
    await first_change(b, greedy_chat(), "Hello there")
    for gateway in (a, b):
        outcome, text, _ = await gateway.ask(greedy_chat())
        assert (outcome, text) == ("HIT", "Fresh words")
    assert await near_hit_on(b, greedy_chat()) == "Fresh words"


async def test_an_entry_deleted_or_flushed_in_redis_is_a_miss_on_both(
    gateways: list[Gateway], raw: redis.Redis
) -> None:
    a = gateways[0]
    one, two = greedy_chat("one"), greedy_chat("two more words")
    for gateway in gateways:
        gateway.engine.words = ["Old"]
    await a.ask(one)
    (key,) = await written_cache_entries(raw, PREFIX, 1)
    await a.ask(two)
    for gateway in gateways:
        await near_hit_on(gateway, one)
        await near_hit_on(gateway, two)
        gateway.engine.words = ["New"]

    raw.delete(key)
    for gateway in gateways:
        await first_change(gateway, one, "Old")
    raw.flushdb()
    for gateway in gateways:
        await first_change(gateway, two, "Old")


def entries(raw: redis.Redis) -> list[bytes]:
    return cache_entries(raw, PREFIX)


async def test_redis_killed_no_near_hits_and_after_a_restart_no_stale_ones(
    gateways: list[Gateway], server: RedisProcess
) -> None:
    a, b = gateways
    await a.ask(greedy_chat())
    await near_hit_on(b, greedy_chat())
    b.engine.words = ["Regenerated"]

    server.kill()
    # The connection closing flushes the near cache as soon as B's listener reads the close,
    # which may come just after the next request (and a silent connection within MAX_LAG):
    # until then B may serve only the entry it held, then it answers from its engine.
    # A hit is allowed only for a lookup made before the deadline: the time is taken before
    # the request, so a slow answer on a loaded machine is not counted as a late lookup.
    deadline = time.monotonic() + MAX_LAG
    while True:
        asked = time.monotonic()
        got = await b.ask(greedy_chat())
        if got[0] != "HIT":
            break
        assert got[1] == "Hello there" and asked < deadline, (
            got,
            f"asked {asked - deadline + MAX_LAG:.3f} s after the kill (max lag {MAX_LAG} s)",
        )
        await asyncio.sleep(0.01)
    assert got == ("MISS", "Regenerated", 0)
    server.start()  # empty: what the near caches held is gone from Redis
    b.engine.words = ["After restart"]
    outcome, text, _ = await b.ask(greedy_chat())
    assert outcome != "HIT" or text == "After restart"
    # Tracking comes back by itself, and the near cache with it.
    assert await near_hit_on(b, greedy_chat(), within=10.0) == "After restart"


def stored_text(raw: redis.Redis) -> str:
    """The text of the one cache entry in Redis."""
    (key,) = entries(raw)
    data = raw.get(key)
    assert data is not None
    return decode_entry(key.decode(), data)[0].choices[0].text


async def test_redis_frozen_the_near_cache_stops_serving_after_max_lag_and_resumes(
    gateways: list[Gateway], server: RedisProcess, raw: redis.Redis
) -> None:
    """SIGSTOP: no answer on the invalidation connection. Within MAX_LAG the near cache
    may still serve (nothing can change in Redis unreported for longer than that); after
    it, it serves nothing until Redis answers again, and then what Redis holds."""
    b = gateways[1]
    await b.ask(greedy_chat())
    await near_hit_on(b, greedy_chat())
    b.engine.words = ["From the engine"]
    server.freeze()
    try:
        await asyncio.sleep(MAX_LAG + 0.05)
        outcome, text, hits = await b.ask(greedy_chat())
        assert (outcome, text, hits) == ("MISS", "From the engine", 0)
    finally:
        server.thaw()
    # The same connection answers again, having missed nothing. The miss's write may have
    # reached the frozen Redis's socket (when its answer came after the store's retry
    # interval) and then runs on the thaw, though the gateway gave up on it: the entry is
    # the old one or that one, and the near cache serves whichever Redis holds.
    served = await near_hit_on(b, greedy_chat(), within=10.0)
    assert served in ("Hello there", "From the engine")
    assert served == stored_text(raw)


async def test_entries_read_from_redis_are_kept_within_the_bound(
    server: RedisProcess, raw: redis.Redis
) -> None:
    """Through the cache's own reads: the least recently read go (100,000 keys without
    Redis: `test_near.py`)."""
    bound = 64 * 1024
    client = redis_client(server.url, 8)
    near = NearCache(bound, bound)
    listener = InvalidationListener(client, near, f"{PREFIX}:cache:", 1.0, 0.1)
    listener.start()
    cache = ResponseCache(
        RedisStore(client, op_timeout=2.0),
        TtlPolicy(TtlRule()),
        CacheConfig(prefix=PREFIX),
        near,
        listener,
    )
    keys = [f"{PREFIX}:cache:v1:m:{i:064x}" for i in range(2000)]
    completion = fake_completion("A river is a natural stream of water.")
    with raw.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.set(key, encode_entry(key, completion, time.time()), px=600_000)
        pipe.execute()
    try:
        for _ in range(500):
            if near.connected:
                break
            await asyncio.sleep(0.01)
        for start in range(0, len(keys), 8):
            found = await asyncio.gather(*(cache.fetch(key) for key in keys[start : start + 8]))
            assert all(hit is not None for hit in found)
            assert near.size_bytes <= bound
        assert 10 < len(near) < 2000
        before = near_hits()
        assert await cache.fetch(keys[-1]) is not None and near_hits() - before == 1
        assert await cache.fetch(keys[0]) is not None and near_hits() - before == 1
    finally:
        await cache.close()
        await client.aclose()
