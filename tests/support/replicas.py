"""Two replicas of the real app (a fake engine each) over one Redis, with managed keys, and
the calls the tests of keys, usage and budgets make on them over HTTP."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
from fastapi import FastAPI

from tests.support.fakes import chat_body, fake_app, serve_in_thread
from tests.support.redis_server import shared_redis_url

ADMIN = "sk-admin-for-replicas"


def replica(prefix: str, redis_url: str | None = None, **settings: object) -> FastAPI:
    """The app with managed keys, the cache off (unless `settings` say), and the ledger
    written every 50 ms."""
    return fake_app(
        redis_url=redis_url or shared_redis_url(),
        redis_key_prefix=prefix,
        managed_keys=True,
        admin_api_keys=ADMIN,
        **{"cache_policy": "off", "usage_flush_interval": 0.05, **settings},
    )


@contextlib.contextmanager
def two_replicas(prefix: str, **settings: object) -> Iterator[tuple[str, str]]:
    with (
        serve_in_thread(replica(prefix, **settings)) as a,
        serve_in_thread(replica(prefix, **settings)) as b,
    ):
        yield a, b


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def create_key(url: str, **settings: Any) -> dict[str, Any]:
    """A new managed key, made by an admin: its id, settings and secret (`key`)."""
    answer = httpx.post(f"{url}/admin/keys", json=settings, headers=auth(ADMIN), timeout=10)
    assert answer.status_code == 201, answer.text
    return dict(answer.json())


def chat(url: str, key: str, **extra: Any) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/chat/completions", json=chat_body(**extra), headers=auth(key), timeout=10
    )


def until(status: int, send: Callable[[], httpx.Response]) -> None:
    """Once `send()` answers `status` (a change reaching the other replica; pytest's timeout
    bounds one that never does: how fast it comes is measured in bench/, not asserted)."""
    while send().status_code != status:
        time.sleep(0.02)


def known_on(url: str, key: str) -> None:
    """Once the replica at `url` knows the key."""
    until(200, lambda: httpx.get(f"{url}/v1/models", headers=auth(key)))
