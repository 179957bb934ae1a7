"""Single flight for generations longer than the flight timeout: identical requests attach to
the leader's live output, streamed or not, and the engine runs once; and the entry a flight
stores once its readers have all left."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
import redis

from sluicegate.cache.entry import decode_entry
from sluicegate.cache.flight import Flight
from sluicegate.cache.key import lock_key
from sluicegate.cache.response_cache import CacheConfig, ResponseCache
from sluicegate.cache.store import CacheStore, MemoryStore, RedisStore
from sluicegate.cache.ttl import TtlPolicy, TtlRule
from sluicegate.engine.protocol import ChoiceDelta
from sluicegate.wiring import redis_client
from tests.support.fakes import (
    SLOW_OK,
    FakeEngine,
    fake_app,
    greedy_chat,
    post,
    redis_cache,
    serve_in_thread,
)
from tests.support.redis_server import shared_redis_url
from tests.support.sse import sse_payloads

WORDS = [f" w{i}" for i in range(10)]
STEP = 0.1  # 10 steps of 0.1 s: the generation outlives the flight timeout three times
FLIGHT_TIMEOUT = 0.3


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest, prefix: str) -> dict[str, object]:
    settings: dict[str, object] = {"cache_flight_timeout": FLIGHT_TIMEOUT}
    if request.param == "redis":
        settings.update(redis_cache(prefix))
    return settings


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine(words=list(WORDS), step_delay=STEP, max_model_len=256)


class Timed:
    """A streamed response read to the end, with when its first content came and when it
    ended."""

    def __init__(self) -> None:
        self.text = ""
        self.first_content: float | None = None
        self.ended = 0.0
        self.headers: httpx.Headers | None = None

    async def read(self, client: httpx.AsyncClient, body: dict[str, Any]) -> Timed:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            self.headers = response.headers
            async for chunk in response.aiter_text():
                self.text += chunk
                if self.first_content is None and '"content":" w' in self.text:
                    self.first_content = time.monotonic()
        self.ended = time.monotonic()
        return self


def content(events: list[Any]) -> str:
    return "".join(
        e["choices"][0]["delta"].get("content", "")
        for e in events
        if isinstance(e, dict) and e["choices"]
    )


async def words_in(leading: Timed, within: float = 10.0) -> None:
    """Until the leader has had its first words (polled: a fixed wait may be too short on a
    loaded machine, and the follower would lead)."""
    deadline = time.monotonic() + within
    while leading.first_content is None:
        assert time.monotonic() < deadline, "the leader had no content"
        await asyncio.sleep(0.01)


async def test_a_streamed_follower_attaches_to_the_live_stream(
    store: dict[str, object], engine: FakeEngine
) -> None:
    body = greedy_chat(stream=True, stream_options={"include_usage": True})
    with serve_in_thread(fake_app(engine, **store)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            leading = Timed()
            leader = asyncio.create_task(leading.read(client, body))
            await words_in(leading)
            follower = await Timed().read(client, body)
            leader_done = await leader
    assert len(engine.requests) == 1
    assert sse_payloads(follower.text) == sse_payloads(leader_done.text)
    assert content(sse_payloads(follower.text)) == "".join(WORDS)
    # Live: the follower had output while the leader was still generating.
    assert follower.first_content is not None
    assert follower.first_content < leader_done.ended - 3 * STEP
    assert follower.headers is not None and follower.headers["x-cache"] == "HIT"


async def test_a_non_streamed_follower_gets_the_whole_result(
    store: dict[str, object], engine: FakeEngine
) -> None:
    with serve_in_thread(fake_app(engine, **store)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            leading = Timed()
            leader = asyncio.create_task(leading.read(client, greedy_chat(stream=True)))
            await words_in(leading)
            follower = await post(client, greedy_chat())
            await leader
    assert len(engine.requests) == 1
    assert follower.json()["choices"][0]["message"]["content"] == "".join(WORDS)
    assert follower.json()["usage"]["completion_tokens"] == len(WORDS)


async def generating(engine: FakeEngine) -> None:
    """Until the first request reaches the engine."""
    deadline = time.monotonic() + 10
    while not engine.requests:
        assert time.monotonic() < deadline, "no request reached the engine"
        await asyncio.sleep(0.01)


async def test_the_leaders_client_leaving_does_not_end_the_followers_answer(
    store: dict[str, object], engine: FakeEngine
) -> None:
    with serve_in_thread(fake_app(engine, **store)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:

            async def leave_early() -> None:
                async with client.stream(
                    "POST", "/v1/chat/completions", json=greedy_chat(stream=True)
                ) as r:
                    async for _ in r.aiter_bytes():
                        await asyncio.sleep(0.4)
                        break  # leave while the run goes on

            leader = asyncio.create_task(leave_early())
            await generating(engine)  # the leader leads: the others follow it
            streamed = asyncio.create_task(Timed().read(client, greedy_chat(stream=True)))
            plain = await post(client, greedy_chat())
            await leader
            follower = await streamed
            after = await post(client, greedy_chat())
    assert len(engine.requests) == 1
    assert plain.json()["choices"][0]["message"]["content"] == "".join(WORDS)
    assert content(sse_payloads(follower.text)) == "".join(WORDS)
    # The run the followers kept alive ended normally, so it was stored.
    assert after.headers["x-cache"] == "HIT"


async def test_followers_leaving_do_not_abort_the_leader(
    store: dict[str, object], engine: FakeEngine
) -> None:
    with serve_in_thread(fake_app(engine, **store)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            leading = Timed()
            leader = asyncio.create_task(leading.read(client, greedy_chat(stream=True)))
            await words_in(leading)
            gone = [
                asyncio.create_task(client.post("/v1/chat/completions", json=greedy_chat(stream=s)))
                for s in (False, True)
            ]
            await asyncio.sleep(0.3)
            for task in gone:
                task.cancel()
            await asyncio.gather(*gone, return_exceptions=True)
            done = await leader
    assert len(engine.requests) == 1
    assert content(sse_payloads(done.text)) == "".join(WORDS)


async def test_an_abandoned_flight_aborts_the_engine_and_the_next_request_leads(
    store: dict[str, object], engine: FakeEngine
) -> None:
    with serve_in_thread(fake_app(engine, **store)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            async with client.stream(
                "POST", "/v1/chat/completions", json=greedy_chat(stream=True)
            ) as r:
                async for _ in r.aiter_bytes():
                    break
            deadline = time.monotonic() + 10
            while engine.active:
                assert time.monotonic() < deadline, "the engine request was not aborted in 10 s"
                await asyncio.sleep(0.02)
            engine.step_delay = 0
            again = await post(client, greedy_chat())
    assert again.headers["x-cache"] == "MISS"
    assert again.json()["choices"][0]["message"]["content"] == "".join(WORDS)
    assert len(engine.requests) == 2


async def test_the_redis_lock_lives_as_long_as_the_leader(prefix: str) -> None:
    """Another replica keeps waiting for the entry however long the leader generates, and
    the lock is gone once the leader is done."""
    engines = [FakeEngine(words=list(WORDS), step_delay=STEP, max_model_len=256) for _ in range(2)]
    settings = {
        "redis_url": shared_redis_url(),
        "redis_key_prefix": prefix,
        "cache_redis_timeout": SLOW_OK,
        "cache_flight_timeout": FLIGHT_TIMEOUT,
    }
    raw = redis.Redis.from_url(shared_redis_url())
    with (
        serve_in_thread(fake_app(engines[0], **settings)) as url_a,
        serve_in_thread(fake_app(engines[1], **settings)) as url_b,
    ):
        async with (
            httpx.AsyncClient(base_url=url_a, timeout=30) as a,
            httpx.AsyncClient(base_url=url_b, timeout=30) as b,
        ):
            leader = asyncio.create_task(post(a, greedy_chat()))
            await asyncio.sleep(3 * FLIGHT_TIMEOUT)
            locks = [k for k in raw.scan_iter(match=f"{prefix}:cache:*") if k.endswith(b":lock")]
            assert len(locks) == 1 and raw.pttl(locks[0]) > 0, "the lock outlived its first expiry"
            other = await post(b, greedy_chat())
            first = await leader
            deadline = time.monotonic() + 10
            while raw.exists(locks[0]):  # the release runs after the response
                assert time.monotonic() < deadline, "the lock outlived its leader by 10 s"
                await asyncio.sleep(0.01)
    raw.close()
    assert sum(len(e.requests) for e in engines) == 1
    assert other.headers["x-cache"] == "HIT"
    assert other.json()["choices"][0]["message"] == first.json()["choices"][0]["message"]
    assert lock_key("x") == "x:lock"


class OpeningStore(MemoryStore):
    """The memory store, each write first waiting on the loop, as a Redis command does while
    its connection is being opened."""

    async def set(self, key: str, value: bytes, ttl_ms: int) -> None:
        await asyncio.sleep(0)
        await super().set(key, value, ttl_ms)


async def run_of(text: str) -> AsyncIterator[ChoiceDelta]:
    for word in text.split(" "):
        yield ChoiceDelta(0, word + " ", 1)
    yield ChoiceDelta(0, "", 0, "stop")


async def stored_text(store: CacheStore, key: str, text: str) -> str | None:
    """The text stored under `key` once it is `text` (within 10 s), or the last one seen."""
    deadline = time.monotonic() + 10
    found = None
    while True:
        stored = await store.read(key)
        found = None if stored is None else decode_entry(key, stored[0])[0].choices[0].text
        if found == text or time.monotonic() > deadline:
            return found
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("kind", ["opening", "redis"])
async def test_the_entry_is_stored_though_its_readers_left_when_the_run_ended(
    kind: str, prefix: str
) -> None:
    """The leader's reader leaves as soon as the run ends (its response sent), while the
    entry is being written. The write goes on: a refresh (no-cache) replaces the entry,
    and this process reads the newest one meanwhile. With Redis, a client of its own: the
    first write opens the connection."""
    close: Callable[[], Any] | None = None
    store: CacheStore
    if kind == "redis":
        client = redis_client(shared_redis_url(), 4)
        store, close = RedisStore(client, op_timeout=SLOW_OK), client.aclose
    else:
        store = OpeningStore(max_bytes=1 << 20)
    cache = ResponseCache(store, TtlPolicy(TtlRule()), CacheConfig(prefix=prefix))
    key = f"{prefix}:cache:v1:m:{0:064x}"
    try:
        for text in ("Old words", "Fresh words"):
            flight = Flight(cache, key, 1, lambda: 3, store=True, max_entry_bytes=1 << 20)
            async for _ in flight.lead(run_of(text)):
                pass
            hit = await cache.fetch(key)  # while the write may still be under way
            assert hit is not None and hit.completion is not None
            assert hit.completion.choices[0].text == text + " "
            assert await stored_text(store, key, text + " ") == text + " "
    finally:
        await cache.close()
        if close is not None:
            await close()
