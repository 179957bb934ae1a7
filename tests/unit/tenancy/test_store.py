"""`KeyStore` alone, against a Redis of its own: what a whole reload makes of an empty Redis
(lost data, or every key deleted)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import redis.asyncio

from sluicegate.errors import ConflictError
from sluicegate.keys import digest_of
from sluicegate.tenancy.records import KeyRecord
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


async def test_the_keys_stay_kept_until_a_restore_ends_it_in_every_process(
    tmp_path: Path,
) -> None:
    """Two processes keep their copies after a FLUSHALL. A key written meanwhile (by a process
    started since, which kept nothing) once ended the keeping at every process's next reload,
    dropping every other key: now the copies stay (with that key too), creating and changing
    keys are refused until a restore, and a restore in one process ends it in both."""
    with running_redis(tmp_path) as server:
        client = redis.asyncio.Redis.from_url(server.url)
        here, there, made = await _kept_by_two(client)
        newcomer = KeyStore(client, "p")
        await newcomer.start()  # knows no key: keeps none, may write one
        made.append(await newcomer.create(KeySettings()))
        for store in (here, there):
            with pytest.raises(ConflictError):
                await store.create(KeySettings())
            with pytest.raises(ConflictError):
                await store.update(made[0][0].id, KeySettings(rpm=5))
            await store.close()
            await store.start()  # a reload that finds a key in redis: still kept
            for record, secret in made:
                assert store.find(digest_of(secret)) == record
        restored = await here.restore()
        assert sorted(r.id for r in restored) == sorted(r.id for r, _ in made[:-1])
        await here.create(KeySettings())
        await there.close()
        await there.start()  # reads the restore in the change log: the keeping ends
        await there.create(KeySettings())
        for store in (here, there, newcomer):
            await store.close()
        await client.aclose()


async def test_a_kept_key_deleted_is_revoked_in_every_process_and_not_restored(
    tmp_path: Path,
) -> None:
    """A leaked key kept over a FLUSHALL once answered 404 to its DELETE and went on working
    everywhere."""
    with running_redis(tmp_path) as server:
        client = redis.asyncio.Redis.from_url(server.url)
        here, there, made = await _kept_by_two(client)
        (leaked, secret), *others = made
        await there.delete(leaked.id)
        assert there.find(digest_of(secret)) is None
        await _dropped(here, secret)  # through the change log
        restored = await here.restore()
        assert sorted(r.id for r in restored) == sorted(r.id for r, _ in others)
        for store in (here, there):
            await store.close()
            await store.start()  # a whole reload, of what redis holds
            assert store.find(digest_of(secret)) is None
            for record, kept in others:
                assert store.find(digest_of(kept)) == record
            await store.close()
        await client.aclose()


async def _kept_by_two(
    client: redis.asyncio.Redis,
) -> tuple[KeyStore, KeyStore, list[tuple[KeyRecord, str]]]:
    """Two processes, three keys, a FLUSHALL, and a whole reload in each: the keys kept."""
    here, there = KeyStore(client, "p", sync_interval=0.02), KeyStore(client, "p")
    await here.start()
    made = [await here.create(KeySettings()) for _ in range(3)]
    await there.start()
    await client.flushall()
    for store in (here, there):
        await store.close()
        await store.start()
    return here, there, made


async def _dropped(store: KeyStore, secret: str) -> None:
    """Once `store` no longer knows the key (pytest's timeout bounds a change never read)."""
    while True:
        if store.find(digest_of(secret)) is None:
            return
        await asyncio.sleep(0.02)  # polled: the follower tells no one of a change


async def _counted(metric: str, at_least: float) -> None:
    """Once `metric` has counted `at_least` (pytest's timeout bounds a reload that never
    comes)."""
    while True:
        if local_value(metric) >= at_least:
            return
        await asyncio.sleep(0.02)  # polled: the follower tells no one of a reload
