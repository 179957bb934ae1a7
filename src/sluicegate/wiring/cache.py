"""The cache: the response cache (a near cache over Redis or memory) and the embeddings'."""

from __future__ import annotations

from contextlib import AsyncExitStack

import redis.asyncio

from sluicegate.cache.embedding_cache import EmbeddingCache, EmbeddingCacheConfig
from sluicegate.cache.invalidation import InvalidationListener
from sluicegate.cache.near import NearCache
from sluicegate.cache.response_cache import CacheConfig, Coherence, ResponseCache
from sluicegate.cache.store import CacheStore, MemoryStore, RedisStore
from sluicegate.cache.ttl import TtlPolicy, TtlRule
from sluicegate.settings import Settings


def ttl_rule(settings: Settings) -> TtlRule:
    return TtlRule(
        base=settings.cache_ttl_seconds,
        minimum=settings.cache_ttl_min_seconds,
        maximum=settings.cache_ttl_max_seconds,
        fast_below=settings.cache_ttl_fast_latency,
        slow_above=settings.cache_ttl_slow_latency,
        fast_factor=settings.cache_ttl_fast_factor,
        slow_factor=settings.cache_ttl_slow_factor,
        jitter=settings.cache_ttl_jitter,
    )


def cache_config(settings: Settings) -> CacheConfig:
    return CacheConfig(
        policy=settings.cache_policy,
        prefix=settings.redis_key_prefix,
        # Tenants apart unless sharing is asked for; without keys everyone is `anonymous`.
        per_key=settings.keyed and not settings.cache_shared_across_keys,
        max_entry_bytes=settings.cache_max_entry_bytes,
        flight_timeout=settings.cache_flight_timeout,
        retry_interval=settings.cache_retry_interval,
    )


async def open_cache(settings: Settings, client: redis.asyncio.Redis | None) -> ResponseCache:
    """The response cache on Redis when there is one (shared by replicas), else in memory;
    with a near cache in front, kept true to Redis by Redis's reports of changes. Each run
    says which model, and which weights, its key is for (`Run.model`, `Run.identity`)."""
    store: CacheStore = (
        MemoryStore(settings.cache_memory_max_bytes)
        if client is None
        else RedisStore(client, op_timeout=settings.cache_redis_timeout)
    )
    near = NearCache(settings.cache_near_max_bytes, settings.cache_max_entry_bytes)
    coherence: Coherence | None = None
    if client is not None and near.max_bytes:
        listener = InvalidationListener(
            client,
            near,
            prefix=f"{settings.redis_key_prefix}:cache:",
            max_lag=settings.cache_near_max_lag,
            retry_interval=settings.cache_retry_interval,
        )
        listener.start()
        coherence = listener
    config = cache_config(settings)
    ttl = TtlPolicy(ttl_rule(settings))
    return ResponseCache(store, ttl, config, near, coherence)


def embedding_cache(
    settings: Settings, client: redis.asyncio.Redis | None, cache: ResponseCache
) -> EmbeddingCache:
    """Inputs' embeddings in the response cache's store, with their own TTL."""
    config = EmbeddingCacheConfig(
        prefix=settings.redis_key_prefix,
        ttl_seconds=settings.embedding_cache_ttl_seconds,
        per_key=cache_config(settings).per_key,
        retry_interval=settings.cache_retry_interval,
    )
    return EmbeddingCache(cache.store, config)


async def enter_cache(
    settings: Settings, stack: AsyncExitStack, client: redis.asyncio.Redis | None
) -> tuple[ResponseCache, EmbeddingCache]:
    """The response cache and the embedding cache in its store, for the lifespan: closed
    when `stack` unwinds."""
    cache = await open_cache(settings, client)
    stack.push_async_callback(cache.close)
    embeddings = embedding_cache(settings, client, cache)
    stack.push_async_callback(embeddings.close)
    return cache, embeddings
