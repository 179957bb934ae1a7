"""The key store against a Redis that pauses for less than the pool's socket timeout: the
store's own timeout ends the wait, and the pooled connection survives."""

from __future__ import annotations

from pathlib import Path

from sluicegate.errors import StoreUnavailableError
from sluicegate.tenancy.store import KeyStore
from sluicegate.wire.admin_keys import KeySettings
from sluicegate.wiring import redis_client
from tests.support.redis_server import running_redis


async def test_a_short_pause_fails_the_change_and_costs_no_connection(
    tmp_path: Path, prefix: str
) -> None:
    with running_redis(tmp_path) as server:
        client = redis_client(server.url, max_connections=1)
        store = KeyStore(client, prefix, op_timeout=0.1)
        await store.create(KeySettings(name="before"))
        raised, kept = await server.across_a_pause(
            client, lambda: store.create(KeySettings(name="during")), pause=0.5
        )
        assert isinstance(raised, StoreUnavailableError)
        assert kept, "a 0.5 s pause tore the pooled connection down"
        # The store reads its changes on the same connection.
        created, _ = await store.create(KeySettings(name="after"))
        assert (await store.get(created.id)).settings["name"] == "after"
        await store.close()
        await client.aclose()
