"""The response cache through real HTTP, over the fake engine, with the in-memory store and
with a real Redis (the test process's own, each test under its own key prefix)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis

from sluicegate.engine.protocol import EngineStep, Prompt, SamplingOptions
from sluicegate.errors import EngineUnavailableError
from sluicegate.observability.metrics import (
    CACHE_STAMPEDE_FOLLOWERS,
    CACHE_STORE_ERRORS,
    CACHE_TTL_SECONDS,
)
from tests.support.fakes import (
    SLOW_OK,
    FakeEngine,
    fake_app,
    greedy_chat,
    post,
    redis_cache,
    serve_in_thread,
)
from tests.support.redis_server import (
    RedisProcess,
    cache_entries,
    rewritten_cache_entry,
    shared_redis_url,
    written_cache_entries,
)
from tests.support.sse import sse_payloads

MESSAGES = [{"role": "user", "content": "Say hello"}]


def answer(body: dict[str, Any]) -> Any:
    """A response body without what differs between responses (id, creation time)."""
    return {k: v for k, v in body.items() if k not in {"id", "created"}}


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine(words=["Hello", " there", ",", " friend", "!"], max_model_len=256)


async def test_second_identical_request_is_a_hit_with_the_original_usage(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    first = await post(http, greedy_chat(max_tokens=8))
    second = await post(http, greedy_chat(max_tokens=8))
    assert first.headers["x-cache"] == "MISS" and "age" not in first.headers
    assert second.headers["x-cache"] == "HIT" and int(second.headers["age"]) >= 0
    assert answer(second.json()) == answer(first.json())
    assert second.json()["usage"] == first.json()["usage"]
    assert second.json()["id"] != first.json()["id"]
    assert len(engine.requests) == 1


async def test_key_order_and_whitespace_outside_strings_do_not_change_the_key(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    compact = json.dumps(greedy_chat(max_tokens=5), separators=(",", ":"))
    body = greedy_chat(max_tokens=5)
    reordered = json.dumps(dict(reversed(list(body.items()))), indent=3)
    headers = {"content-type": "application/json"}
    first = await http.post("/v1/chat/completions", content=compact, headers=headers)
    second = await http.post("/v1/chat/completions", content=reordered, headers=headers)
    assert (first.headers["x-cache"], second.headers["x-cache"]) == ("MISS", "HIT")
    assert len(engine.requests) == 1


async def test_sampled_requests_bypass_the_cache(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    for _ in range(2):
        response = await post(http, greedy_chat(temperature=0.8))
        assert response.headers["x-cache"] == "BYPASS"
    seeded = [await post(http, greedy_chat(temperature=0.8, seed=3)) for _ in range(2)]
    assert [r.headers["x-cache"] for r in seeded] == ["MISS", "HIT"]
    assert len(engine.requests) == 3


async def test_no_cache_skips_the_lookup_and_refreshes_the_entry(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    await post(http, greedy_chat())
    engine.words = ["Fresh", " words"]
    refreshed = await post(http, greedy_chat(), **{"cache-control": "no-cache"})
    assert refreshed.headers["x-cache"] == "BYPASS"
    assert refreshed.json()["choices"][0]["message"]["content"] == "Fresh words"
    again = await post(http, greedy_chat())
    assert again.headers["x-cache"] == "HIT"
    assert again.json()["choices"][0]["message"]["content"] == "Fresh words"


async def test_no_store_is_served_but_not_stored(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    first = await post(http, greedy_chat(), **{"cache-control": "no-store"})
    second = await post(http, greedy_chat())
    assert (first.headers["x-cache"], second.headers["x-cache"]) == ("MISS", "MISS")
    assert (await post(http, greedy_chat())).headers["x-cache"] == "HIT"
    assert len(engine.requests) == 2


async def test_stream_hit_replays_the_live_stream(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    body = greedy_chat(stream=True, stream_options={"include_usage": True})
    live = await post(http, body)
    replay = await post(http, body)
    assert (live.headers["x-cache"], replay.headers["x-cache"]) == ("MISS", "HIT")
    assert replay.headers["content-type"].startswith("text/event-stream")
    events = sse_payloads(replay.text)
    assert events == sse_payloads(live.text)
    # role chunk, several content deltas, finish, usage, [DONE]
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    deltas = [e["choices"][0]["delta"]["content"] for e in events[1:-3]]
    assert len(deltas) == 5 and "".join(deltas) == "Hello there, friend!"
    assert events[-3]["choices"][0]["finish_reason"] == "stop"
    assert events[-2]["usage"]["completion_tokens"] == 5 and events[-1] == "[DONE]"
    assert len(engine.requests) == 1


async def test_streamed_and_non_streamed_requests_share_entries(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    streamed = await post(http, greedy_chat(stream=True, max_tokens=3))
    plain = await post(http, greedy_chat(max_tokens=3))
    assert plain.headers["x-cache"] == "HIT"
    text = "".join(
        e["choices"][0]["delta"].get("content", "")
        for e in sse_payloads(streamed.text)
        if e != "[DONE]" and e["choices"]
    )
    assert plain.json()["choices"][0]["message"]["content"] == text == "Hello there,"
    assert plain.json()["choices"][0]["finish_reason"] == "length"

    await post(http, greedy_chat(max_tokens=4))
    replay = await post(http, greedy_chat(max_tokens=4, stream=True))
    assert replay.headers["x-cache"] == "HIT"
    assert len(engine.requests) == 2


async def test_an_abandoned_stream_is_not_stored(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    engine.step_delay = 0.2
    async with http.stream(
        "POST", "/v1/chat/completions", json=greedy_chat(stream=True)
    ) as response:
        assert response.headers["x-cache"] == "MISS"
        async for _ in response.aiter_bytes():
            break  # leave after the first event
    deadline = time.monotonic() + 10
    while engine.active:
        assert time.monotonic() < deadline, "the engine request was not aborted in 10 s"
        await asyncio.sleep(0.02)
    engine.step_delay = 0
    assert (await post(http, greedy_chat(stream=True))).headers["x-cache"] == "MISS"
    assert len(engine.requests) == 2


async def test_errors_are_never_cached(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    engine.fail_after_words = 2
    failed = await http.post("/v1/chat/completions", json=greedy_chat())
    assert failed.status_code == 503
    streamed = await http.post("/v1/chat/completions", json=greedy_chat(stream=True))
    assert '"error"' in streamed.text
    engine.fail_after_words = None
    response = await post(http, greedy_chat())
    assert response.headers["x-cache"] == "MISS"
    assert response.json()["choices"][0]["message"]["content"] == "Hello there, friend!"


async def test_fifty_identical_requests_cause_one_generation(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    engine.step_delay = 0.05
    followers = CACHE_STAMPEDE_FOLLOWERS._value.get()
    bodies = [greedy_chat(stream=i % 2 == 0) for i in range(50)]
    responses = await asyncio.gather(*(post(http, b) for b in bodies))
    outcomes = sorted(r.headers["x-cache"] for r in responses)
    assert outcomes == ["HIT"] * 49 + ["MISS"]
    assert len(engine.requests) == 1
    assert CACHE_STAMPEDE_FOLLOWERS._value.get() - followers >= 1
    plain = [r.json() for r in responses if not r.headers["content-type"].startswith("text/")]
    assert all(b["choices"][0]["message"]["content"] == "Hello there, friend!" for b in plain)


class FailsFirst(FakeEngine):
    """Fails the first generation after one word; every later one succeeds."""

    async def generate(  # type: ignore[override]
        self,
        request_id: str,
        prompt: Prompt,
        options: SamplingOptions,
        *,
        arrival_time: float,
        priority: int = 0,
        adapter: str | None = None,
    ) -> AsyncIterator[EngineStep]:
        first = not self.requests
        steps = super().generate(
            request_id, prompt, options, arrival_time=arrival_time, priority=priority
        )
        async for step in steps:
            yield step
            if first:
                raise EngineUnavailableError()


async def test_followers_of_a_failed_leader_generate_for_themselves(
    store_settings: dict[str, object],
) -> None:
    engine = FailsFirst(words=["Hello", " there"], step_delay=0.1)
    with serve_in_thread(fake_app(engine, **store_settings)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            leader = asyncio.create_task(client.post("/v1/chat/completions", json=greedy_chat()))
            deadline = time.monotonic() + 10
            while not engine.requests:  # the leader holds the lock once it generates
                assert time.monotonic() < deadline, "the leader never reached the engine"
                await asyncio.sleep(0.01)
            followers = [client.post("/v1/chat/completions", json=greedy_chat()) for _ in range(5)]
            responses = await asyncio.gather(*followers)
            assert (await leader).status_code == 503
    assert [r.status_code for r in responses] == [200] * 5
    assert all(r.headers["x-cache"] in {"MISS", "HIT"} for r in responses)
    assert all(r.json()["choices"][0]["message"]["content"] == "Hello there" for r in responses)
    assert len(engine.requests) >= 2


async def test_policy_off_bypasses_everything() -> None:
    engine = FakeEngine()
    with serve_in_thread(fake_app(engine, cache_policy="off")) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            for _ in range(2):
                response = await post(client, greedy_chat())
                assert response.headers["x-cache"] == "BYPASS"
    assert len(engine.requests) == 2


# ---- Redis-specific behaviour ------------------------------------------------------------


def store_errors() -> float:
    return sum(
        CACHE_STORE_ERRORS.labels(op=op)._value.get()
        for op in ("get", "set", "lock", "unlock", "decode")
    )


def redis_entries(prefix: str) -> list[bytes]:
    client = redis.Redis.from_url(shared_redis_url())
    try:
        return cache_entries(client, prefix)
    finally:
        client.close()


async def test_redis_ttl_follows_the_policy(prefix: str) -> None:
    settings = {
        "redis_url": shared_redis_url(),
        "redis_key_prefix": prefix,
        "cache_redis_timeout": SLOW_OK,
        "cache_ttl_seconds": 100,
        "cache_ttl_max_seconds": 1000,
    }
    engine = FakeEngine(delays=[0.3, 0.3, 0.3])  # ~0.9 s per generation: "slow"
    with serve_in_thread(fake_app(engine, **settings)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            await post(client, greedy_chat(max_tokens=3))
            assert CACHE_TTL_SECONDS._value.get() == 50
            engine.delays = None  # fast from now on, but the average takes a while to follow
            for i in range(12):
                await post(client, greedy_chat(max_tokens=2, seed=i))
            assert CACHE_TTL_SECONDS._value.get() == 300
    (slow_key,) = [
        k
        for k in redis_entries(prefix)
        if redis.Redis.from_url(shared_redis_url()).pttl(k) <= 55_000
    ]
    pttl = redis.Redis.from_url(shared_redis_url()).pttl(slow_key)
    assert 44_000 <= pttl <= 55_000
    fast = [redis.Redis.from_url(shared_redis_url()).pttl(k) for k in redis_entries(prefix)]
    assert max(fast) > 260_000 and max(fast) <= 330_000


async def test_a_corrupt_entry_is_a_miss_and_is_replaced(prefix: str) -> None:
    engine = FakeEngine()
    # The store's entries alone: a near copy (kept after the first HIT) is dropped only when
    # Redis's report of the change arrives, which a request right after the change may beat
    # (the near cache's coherence is `test_invalidation.py`'s).
    settings = redis_cache(prefix, cache_near_max_bytes=0)
    errors = CACHE_STORE_ERRORS.labels(op="decode")._value.get()
    with serve_in_thread(fake_app(engine, **settings)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            await post(client, greedy_chat())
            raw = redis.Redis.from_url(shared_redis_url())
            (entry,) = await written_cache_entries(raw, prefix, 1)
            for garbage in (b"\x00garbage", b'{"version": 1, "key": "someone else"}'):
                raw.set(entry, garbage)
                response = await post(client, greedy_chat())
                assert response.headers["x-cache"] == "MISS"
                assert response.json()["choices"][0]["message"]["content"] == "Hello there!"
                await rewritten_cache_entry(raw, entry, garbage)
                assert (await post(client, greedy_chat())).headers["x-cache"] == "HIT"
            raw.close()
    assert CACHE_STORE_ERRORS.labels(op="decode")._value.get() - errors == 2
    assert len(engine.requests) == 3


async def test_unreachable_redis_serves_from_the_engine_and_warns_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = FakeEngine()
    errors = sum(CACHE_STORE_ERRORS.labels(op=op)._value.get() for op in ("get", "lock", "set"))
    settings = {"redis_url": "redis://127.0.0.1:1/0", "cache_retry_interval": 0}
    with (
        caplog.at_level(logging.WARNING, logger="sluicegate.cache.response_cache"),
        serve_in_thread(fake_app(engine, **settings)) as url,
    ):
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            # Five different requests: an entry this process is still writing (Redis
            # refusing the connection) would answer a repeat of its own request.
            for i in range(5):
                started = time.monotonic()
                response = await post(client, greedy_chat(max_tokens=8 + i))
                took = time.monotonic() - started
                assert response.headers["x-cache"] == "MISS"
                # Not held up by the store (a few ms alone): the bound is a stall a user
                # would see, over 5 times what a request takes with both cores busy.
                assert took < 5.0, f"a request took {took:.2f} s with Redis unreachable"
    assert len(engine.requests) == 5
    assert store_errors() - errors >= 5
    warnings = [r for r in caplog.records if "cache store" in r.getMessage()]
    assert len(warnings) == 1


async def lock_released(url: str) -> None:
    """Until no single-flight lock stands in the Redis at `url`."""
    raw = redis.asyncio.Redis.from_url(url)
    deadline = time.monotonic() + 10
    try:
        while await raw.keys("*:lock"):
            assert time.monotonic() < deadline, "the single-flight lock was never released"
            await asyncio.sleep(0.01)
    finally:
        await raw.aclose()


async def test_slow_redis_is_bounded_by_the_operation_timeout(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    pause = 30.0
    server = RedisProcess(tmp_path_factory.mktemp("redis"))
    server.start()
    try:
        engine = FakeEngine()
        errors = store_errors()
        settings = {"redis_url": server.url, "cache_redis_timeout": 0.05}
        with serve_in_thread(fake_app(engine, **settings)) as url:
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                await post(client, greedy_chat())  # warm the connection pool
                await lock_released(server.url)  # which runs after the response
                server.pause(pause)
                await asyncio.to_thread(server.wait_until_paused)
                started = time.monotonic()
                response = await post(client, greedy_chat())
                elapsed = time.monotonic() - started
        # Bounded by the 50 ms operation timeouts (about 0.1 s in all), not by the pause: the
        # bound, a third of the pause, is over 5 times what it takes with both cores busy.
        assert response.headers["x-cache"] == "MISS", response.headers
        assert elapsed < 10.0, f"the request took {elapsed:.2f} s with Redis paused {pause:g} s"
        assert store_errors() > errors
    finally:
        server.kill()


async def test_two_gateways_on_one_redis_generate_once_for_fifty_requests(prefix: str) -> None:
    engines = [FakeEngine(step_delay=0.05), FakeEngine(step_delay=0.05)]
    settings = redis_cache(prefix)
    with (
        serve_in_thread(fake_app(engines[0], **settings)) as url_a,
        serve_in_thread(fake_app(engines[1], **settings)) as url_b,
    ):
        async with (
            httpx.AsyncClient(base_url=url_a, timeout=30) as a,
            httpx.AsyncClient(base_url=url_b, timeout=30) as b,
        ):
            responses = await asyncio.gather(
                *(post((a, b)[i % 2], greedy_chat()) for i in range(50))
            )
    assert sum(len(e.requests) for e in engines) == 1
    assert sorted(r.headers["x-cache"] for r in responses) == ["HIT"] * 49 + ["MISS"]


# ---- the fast path (hits answered before routing) ---------------------------------------


async def test_fast_path_hits_still_count_against_rate_limits() -> None:
    engine = FakeEngine()
    settings = {"api_keys": "sk-limited-01", "rate_limit_requests_per_minute": 3}
    auth = {"authorization": "Bearer sk-limited-01"}
    with serve_in_thread(fake_app(engine, **settings)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30, headers=auth) as client:
            responses = [
                await client.post("/v1/chat/completions", json=greedy_chat()) for _ in range(4)
            ]
            anonymous = await client.post(
                "/v1/chat/completions", json=greedy_chat(), headers={"authorization": ""}
            )
    assert [r.status_code for r in responses] == [200, 200, 200, 429]
    assert [r.headers.get("x-cache") for r in responses[:3]] == ["MISS", "HIT", "HIT"]
    assert responses[2].headers["x-ratelimit-remaining-requests"] == "0"
    error = responses[3].json()["error"]
    assert error["code"] == "rate_limit_exceeded" and int(responses[3].headers["retry-after"]) >= 1
    assert anonymous.status_code == 401
    assert len(engine.requests) == 1


async def test_fast_path_falls_back_when_the_entry_is_gone(prefix: str) -> None:
    engine = FakeEngine()
    # The store's entry alone (a near copy lasts until Redis's report of the delete arrives).
    settings = redis_cache(prefix, cache_near_max_bytes=0)
    with serve_in_thread(fake_app(engine, **settings)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            await post(client, greedy_chat())
            assert (await post(client, greedy_chat())).headers["x-cache"] == "HIT"
            raw = redis.Redis.from_url(shared_redis_url())
            raw.delete(*redis_entries(prefix))
            raw.close()
            again = await post(client, greedy_chat())
    assert again.headers["x-cache"] == "MISS"
    assert again.json()["choices"][0]["message"]["content"] == "Hello there!"
    assert len(engine.requests) == 2


async def test_body_limits_apply_before_the_cache() -> None:
    engine = FakeEngine()
    big = greedy_chat(messages=[{"role": "user", "content": "x " * 2000}])
    payload = json.dumps(big).encode()

    async def chunked() -> AsyncIterator[bytes]:  # no Content-Length: the limit is counted
        for start in range(0, len(payload), 512):
            yield payload[start : start + 512]

    with serve_in_thread(fake_app(engine, max_request_bytes=1024)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            declared = await client.post("/v1/chat/completions", content=payload)
            streamed = await client.post("/v1/chat/completions", content=chunked())
    for response in (declared, streamed):
        assert response.status_code == 413
        assert response.json()["error"]["code"] == "request_too_large"
    assert engine.requests == []


async def test_hits_carry_the_budget_headers_of_the_original() -> None:
    engine = FakeEngine(max_model_len=64)
    with serve_in_thread(fake_app(engine)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            first = await post(client, greedy_chat(max_tokens=500))
            second = await post(client, greedy_chat(max_tokens=500))
    budget = {k: v for k, v in first.headers.items() if k.startswith("x-budget-")}
    assert budget and second.headers["x-cache"] == "HIT"
    assert {k: v for k, v in second.headers.items() if k.startswith("x-budget-")} == budget


async def test_entries_over_the_size_limit_are_not_stored() -> None:
    engine = FakeEngine()
    with serve_in_thread(fake_app(engine, cache_max_entry_bytes=64)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            outcomes = [(await post(client, greedy_chat())).headers["x-cache"] for _ in range(2)]
    assert outcomes == ["MISS", "MISS"]
    assert len(engine.requests) == 2


ONE = {"authorization": "Bearer sk-one-0001"}
TWO = {"authorization": "Bearer sk-two-0002"}


async def test_with_api_keys_one_key_never_sees_another_keys_entries(
    store_settings: dict[str, object],
) -> None:
    engine = FakeEngine()
    with serve_in_thread(
        fake_app(engine, api_keys="sk-one-0001,sk-two-0002", **store_settings)
    ) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            first = await post(client, greedy_chat(), **ONE)
            # The second is answered by the fast path (the body's note is in memory now).
            again = await post(client, greedy_chat(), **ONE)
            other = [
                await post(client, greedy_chat(stream=stream), **TWO) for stream in (False, True)
            ]
            others_again = await post(client, greedy_chat(), **TWO)
    assert (first.headers["x-cache"], again.headers["x-cache"]) == ("MISS", "HIT")
    # Key two learns nothing of key one's prompt: no HIT, no Age.
    assert [r.headers["x-cache"] for r in other] == ["MISS", "HIT"]
    assert "age" not in other[0].headers
    assert others_again.headers["x-cache"] == "HIT"
    assert len(engine.requests) == 2


async def test_sharing_across_keys_is_an_explicit_setting(
    store_settings: dict[str, object],
) -> None:
    engine = FakeEngine()
    settings = {"api_keys": "sk-one-0001,sk-two-0002", "cache_shared_across_keys": True}
    with serve_in_thread(fake_app(engine, **settings, **store_settings)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            await post(client, greedy_chat(), **ONE)
            await post(client, greedy_chat(), **ONE)
            other = await post(client, greedy_chat(), **TWO)
    assert other.headers["x-cache"] == "HIT"
    assert len(engine.requests) == 1
