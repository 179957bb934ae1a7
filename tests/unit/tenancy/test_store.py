"""`KeyStore` alone, against a Redis of its own: what a whole reload makes of an empty Redis
(lost data, or every key deleted)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import redis.asyncio

from sluicegate.keys import digest_of
from sluicegate.tenancy.store import KeyStore
from sluicegate.wire.admin_keys import KeySettings
from tests.support.metrics import local_value
from tests.support.redis_server import running_redis

LOST = "sluicegate_managed_keys_store_lost_total"


async def test_a_flushed_redis_is_lost_data_and_the_copy_is_kept(tmp_path: Path) -> None:
    with running_redis(tmp_path) as server:
        client = redis.asyncio.Redis.from_url(server.url)
        store = KeyStore(client, "p", sync_interval=0.02, reload_interval=0.05)
        await store.start()
        made = [await store.create(KeySettings(rpm=10)) for _ in range(3)]
        lost = local_value(LOST)
        await client.flushall()
        await _counted(LOST, lost + 2)  # two reloads: it stays so while redis is empty
        for record, secret in made:
            assert store.find(digest_of(secret)) == record
            assert store.policy(record.id) is not None
        assert len(store) == 3
        await store.close()
        await client.aclose()


async def test_every_key_deleted_while_a_process_was_away_is_deleted_there_too(
    tmp_path: Path,
) -> None:
    """The change log says the keys were deleted: an empty Redis is then no loss."""
    with running_redis(tmp_path) as server:
        client = redis.asyncio.Redis.from_url(server.url)
        here, there = KeyStore(client, "p"), KeyStore(client, "p")
        await here.start()
        record, secret = await here.create(KeySettings())
        await there.start()
        assert there.find(digest_of(secret)) == record
        await there.close()  # away: it follows nothing
        await here.delete(record.id)
        lost = local_value(LOST)
        await there.start()  # back: a whole reload
        assert there.find(digest_of(secret)) is None and len(there) == 0
        assert local_value(LOST) == lost
        for store in (here, there):
            await store.close()
        await client.aclose()


async def _counted(metric: str, at_least: float) -> None:
    """Once `metric` has counted `at_least` (pytest's timeout bounds a reload that never
    comes)."""
    while True:
        if local_value(metric) >= at_least:
            return
        await asyncio.sleep(0.02)  # polled: the follower tells no one of a reload
