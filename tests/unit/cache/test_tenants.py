"""The response cache between API keys: kept apart by default, shared only when asked."""

from __future__ import annotations

import httpx
import pytest

from tests.fakes import FakeEngine, fake_app, serve_in_thread
from tests.unit.cache.test_response_cache import REDIS_URL, SLOW_OK, chat, post

ONE = {"authorization": "Bearer sk-one-0001"}
TWO = {"authorization": "Bearer sk-two-0002"}


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest, prefix: str) -> dict[str, object]:
    if request.param == "memory":
        return {}
    return {"redis_url": REDIS_URL, "redis_key_prefix": prefix, "cache_redis_timeout": SLOW_OK}


async def test_with_api_keys_one_key_never_sees_another_keys_entries(
    store: dict[str, object],
) -> None:
    engine = FakeEngine()
    with serve_in_thread(fake_app(engine, api_keys="sk-one-0001,sk-two-0002", **store)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            first = await post(client, chat(), **ONE)
            # The second is answered by the fast path (the body's note is in memory now).
            again = await post(client, chat(), **ONE)
            other = [await post(client, chat(stream=stream), **TWO) for stream in (False, True)]
            others_again = await post(client, chat(), **TWO)
    assert (first.headers["x-cache"], again.headers["x-cache"]) == ("MISS", "HIT")
    # Key two learns nothing of key one's prompt: no HIT, no Age.
    assert [r.headers["x-cache"] for r in other] == ["MISS", "HIT"]
    assert "age" not in other[0].headers
    assert others_again.headers["x-cache"] == "HIT"
    assert len(engine.requests) == 2


async def test_sharing_across_keys_is_an_explicit_setting(store: dict[str, object]) -> None:
    engine = FakeEngine()
    settings = {"api_keys": "sk-one-0001,sk-two-0002", "cache_shared_across_keys": True}
    with serve_in_thread(fake_app(engine, **settings, **store)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            await post(client, chat(), **ONE)
            await post(client, chat(), **ONE)
            other = await post(client, chat(), **TWO)
    assert other.headers["x-cache"] == "HIT"
    assert len(engine.requests) == 1
