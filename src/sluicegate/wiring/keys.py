"""Keys and the usage ledger: managed keys in Redis, what each key used, and its reader."""

from __future__ import annotations

from contextlib import AsyncExitStack

import redis.asyncio

from sluicegate.keys import key_id
from sluicegate.models.registry import ModelRegistry
from sluicegate.settings import Settings
from sluicegate.tenancy.ledger import UsageLedger
from sluicegate.tenancy.price_memo import PriceMemo
from sluicegate.tenancy.store import KeyStore
from sluicegate.tenancy.usage import UsageReader


def open_key_store(settings: Settings, client: redis.asyncio.Redis | None) -> KeyStore | None:
    """Managed keys (`MANAGED_KEYS`, which the settings allow only with Redis), or None. A new
    key never takes the id of a key of the settings."""
    if not settings.managed_keys or client is None:
        return None
    ring = settings.keyring()
    return KeyStore(
        client,
        settings.redis_key_prefix,
        reserved_ids=[key_id(d) for d in ring.digests],
        sync_interval=settings.key_sync_interval,
    )


def open_ledger(
    settings: Settings, client: redis.asyncio.Redis | None, models: ModelRegistry
) -> UsageLedger | None:
    """The usage ledger in Redis (`USAGE_LEDGER`), or None without Redis."""
    if not settings.usage_ledger or client is None:
        return None
    return UsageLedger(
        client,
        settings.redis_key_prefix,
        price_of=PriceMemo(models.price_of).price,
        flush_interval=settings.usage_flush_interval,
        retention_days=settings.usage_retention_days,
        give_up_after=settings.usage_give_up_seconds,
    )


def usage_reader(settings: Settings, client: redis.asyncio.Redis | None) -> UsageReader | None:
    if not settings.usage_ledger or client is None:
        return None
    return UsageReader(client, settings.redis_key_prefix)


async def enter_key_store(
    settings: Settings, stack: AsyncExitStack, client: redis.asyncio.Redis | None
) -> KeyStore | None:
    """`open_key_store`'s store for the lifespan: started, and closed when `stack` unwinds."""
    keys = open_key_store(settings, client)
    if keys is not None:
        await keys.start()
        stack.push_async_callback(keys.close)
    return keys


def enter_ledger(
    settings: Settings,
    stack: AsyncExitStack,
    client: redis.asyncio.Redis | None,
    models: ModelRegistry,
) -> UsageLedger | None:
    """`open_ledger`'s ledger for the lifespan: started, and closed when `stack` unwinds."""
    ledger = open_ledger(settings, client, models)
    if ledger is not None:
        ledger.start()
        # Before Redis closes (the stack unwinds in reverse): what is pending is written.
        stack.push_async_callback(ledger.close)
    return ledger
