"""Caches: the response cache (policy, TTLs, bounds, Redis, the near cache) and the store
of the Responses API."""

from __future__ import annotations

from typing import Self

from pydantic import BaseModel, Field, model_validator

from sluicegate.cache.key import CachePolicy


class CacheSettings(BaseModel):
    """The response cache and the stored responses."""

    # --- response cache --------------------------------------------------------------
    cache_policy: CachePolicy = Field(
        default="deterministic",
        description="Which responses are cached: `deterministic` (temperature 0, top_k 1 or "
        "a seed), `all`, or `off`.",
    )
    cache_shared_across_keys: bool = Field(
        default=False,
        description="With API keys set, share cache entries between keys. Off: each key has "
        "its own entries, so no key can learn (from `X-Cache`, `Age`) whether or when another "
        "key sent a prompt. Without API keys there is one namespace either way.",
    )
    cache_ttl_seconds: float = Field(
        default=600.0, gt=0, description="Base TTL of a cache entry, scaled by engine latency."
    )
    cache_ttl_min_seconds: float = Field(default=30.0, gt=0, description="Shortest entry TTL.")
    cache_ttl_max_seconds: float = Field(default=3600.0, gt=0, description="Longest entry TTL.")
    cache_ttl_fast_latency: float = Field(
        default=0.2, ge=0, description="Average generation seconds below which TTL is raised."
    )
    cache_ttl_slow_latency: float = Field(
        default=0.8, ge=0, description="Average generation seconds above which TTL is lowered."
    )
    cache_ttl_fast_factor: float = Field(
        default=3.0, gt=0, description="TTL multiplier while generation is fast."
    )
    cache_ttl_slow_factor: float = Field(
        default=0.5, gt=0, description="TTL multiplier while generation is slow."
    )
    cache_ttl_jitter: float = Field(
        default=0.1, ge=0, lt=1, description="Random spread of each TTL (0.1: ±10%)."
    )
    cache_memory_max_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=0,
        description="Size bound of the in-process cache (used when no Redis URL is set).",
    )
    cache_max_entry_bytes: int = Field(
        default=1024 * 1024,
        ge=1,
        description="Larger responses are not cached: a run stops keeping its output for the "
        "cache (and for late identical requests) once it would make a larger entry.",
    )
    cache_redis_timeout: float = Field(
        default=0.05, gt=0, description="Seconds one cache operation may wait for Redis."
    )
    cache_flight_timeout: float = Field(
        default=30.0,
        gt=0,
        description="Seconds the single-flight lock in Redis outlives its last refresh: how "
        "long other replicas may wait for the entry of a leader that died. A living leader "
        "refreshes it, however long it generates.",
    )
    cache_retry_interval: float = Field(
        default=1.0,
        ge=0,
        description="After a Redis failure, seconds the cache is skipped before trying again.",
    )
    cache_near_max_bytes: int = Field(
        default=32 * 1024 * 1024,
        ge=0,
        description="Bytes of decoded entries (and their rendered bodies) each process keeps "
        "in front of the cache store, for hot keys; 0 turns this near cache off. With Redis, "
        "Redis reports every change to a cache key to each process, which drops its copy.",
    )
    cache_near_max_lag: float = Field(
        default=1.0,
        gt=0,
        description="With Redis: seconds the near cache goes on serving after Redis last "
        "proved that it reports every change (a heartbeat answered): the longest a change can "
        "go unseen when the connection to Redis fails silently.",
    )

    # --- responses API store --------------------------------------------------------
    responses_ttl_seconds: int = Field(
        default=30 * 24 * 3600,
        ge=1,
        description="How long a stored response (`store: true`) can be read or continued "
        "(`previous_response_id`); 30 days, as OpenAI keeps them.",
    )
    responses_memory_max_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=0,
        description="Without Redis: bytes of stored responses kept in this process; past it, "
        "the key holding the most loses its oldest first.",
    )
    responses_max_bytes_per_key: int = Field(
        default=16 * 1024 * 1024,
        ge=1024,
        description="Bytes of stored responses one API key may hold (all clients share one "
        "bound without API keys): past it, the key's own oldest are dropped, never another "
        "key's. At least `RESPONSES_MAX_ENTRY_BYTES`, so that a key can always store its "
        "newest.",
    )
    responses_max_entry_bytes: int = Field(
        default=1024 * 1024,
        ge=1024,
        le=16 * 1024 * 1024,
        description="Largest stored response (the response and its whole conversation); a "
        "larger one is answered but not stored. Continuing one decodes, converts and stores "
        "it again on the event loop (about 50 ms per MiB), so keep it small.",
    )
    responses_redis_timeout: float = Field(
        default=0.5,
        gt=0,
        description="Seconds one Redis operation of the response store may take (then 503).",
    )

    @model_validator(mode="after")
    def _check_bounds(self) -> Self:
        if self.cache_ttl_min_seconds > self.cache_ttl_max_seconds:
            raise ValueError("cache_ttl_min_seconds must not exceed cache_ttl_max_seconds")
        if self.cache_ttl_fast_latency > self.cache_ttl_slow_latency:
            raise ValueError("cache_ttl_fast_latency must not exceed cache_ttl_slow_latency")
        if self.responses_max_bytes_per_key < self.responses_max_entry_bytes:
            raise ValueError(
                "responses_max_bytes_per_key must be at least responses_max_entry_bytes "
                f"({self.responses_max_bytes_per_key} < {self.responses_max_entry_bytes})"
            )
        return self
