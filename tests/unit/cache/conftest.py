from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis

REDIS_URL = "redis://127.0.0.1:6379/0"


@pytest.fixture
def prefix() -> Iterator[str]:
    """A Redis key prefix of the test's own, its keys deleted afterwards."""
    value = f"test-{uuid.uuid4().hex}"
    yield value
    client = redis.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(match=f"{value}*"))
    if keys:
        client.delete(*keys)
    client.close()
