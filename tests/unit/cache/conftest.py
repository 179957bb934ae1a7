"""The response cache's tests over the app: each runs against the in-process store and
Redis, over a real loopback server in front of the module's own `engine` fixture."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from tests.support.fakes import FakeEngine, fake_app, redis_cache, serve_in_thread


@pytest.fixture(params=["memory", "redis"])
def store_settings(request: pytest.FixtureRequest, prefix: str) -> dict[str, object]:
    if request.param == "memory":
        return {}
    return redis_cache(prefix)


@pytest.fixture
async def http(
    engine: FakeEngine, store_settings: dict[str, object]
) -> AsyncIterator[httpx.AsyncClient]:
    with serve_in_thread(fake_app(engine, **store_settings)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            yield client
