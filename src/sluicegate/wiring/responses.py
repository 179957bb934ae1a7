"""Stored responses (`/v1/responses`): in Redis when there is one, else in memory."""

from __future__ import annotations

import redis.asyncio

from sluicegate.conversation.store import (
    MemoryResponseStore,
    RedisResponseStore,
    ResponseStore,
    StoreConfig,
)
from sluicegate.settings import Settings


def open_response_store(settings: Settings, client: redis.asyncio.Redis | None) -> ResponseStore:
    """Stored responses in Redis when there is one (shared by replicas, kept across restarts),
    else in this process, bounded in bytes."""
    config = StoreConfig(
        ttl=settings.responses_ttl_seconds,
        max_entry_bytes=settings.responses_max_entry_bytes,
        max_key_bytes=settings.responses_max_bytes_per_key,
    )
    if client is None:
        return MemoryResponseStore(config, settings.responses_memory_max_bytes)
    return RedisResponseStore(
        client,
        config,
        prefix=settings.redis_key_prefix,
        op_timeout=settings.responses_redis_timeout,
    )
