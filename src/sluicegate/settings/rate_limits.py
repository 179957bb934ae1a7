"""Redis and rate limits: where shared state is kept, and the requests and tokens per
minute each API key gets."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, SecretStr


class RateLimitOverride(BaseModel):
    """One API key's own limits, by its public id (`key-` + 12 hex digits)."""

    model_config = ConfigDict(extra="forbid")
    requests_per_minute: int | None = Field(default=None, ge=1)
    tokens_per_minute: int | None = Field(default=None, ge=1)


class RateLimitSettings(BaseModel):
    """Redis and the per-key rate limits."""

    # --- redis and rate limits -------------------------------------------------------
    redis_url: SecretStr | None = Field(
        default=None,
        description="redis://, rediss:// or unix:// URL (may hold a user and password). "
        "Unset: the cache and rate limits are kept in this process.",
    )
    rate_limit_requests_per_minute: int | None = Field(
        default=None, ge=1, description="Default requests per minute per API key. Unset: none."
    )
    rate_limit_tokens_per_minute: int | None = Field(
        default=None,
        ge=1,
        description="Default tokens (prompt + completion) per minute per API key. Unset: none.",
    )
    rate_limit_overrides: dict[str, RateLimitOverride] = Field(
        default_factory=dict,
        description='JSON: {"<key id>": {"requests_per_minute": N, "tokens_per_minute": N}}.',
    )
    rate_limit_redis_timeout: float = Field(
        default=0.25, gt=0, description="Seconds a rate-limit check may wait for Redis."
    )
    rate_limit_local_share: float = Field(
        default=1.0,
        gt=0,
        le=1,
        description="While Redis does not answer, the share of each rate limit this replica "
        "enforces on its own (with N replicas, 1/N keeps the fleet near the limit).",
    )
    rate_limit_redis_url: SecretStr | None = Field(
        default=None,
        description="A Redis of their own for the rate limits, for when the cache's Redis "
        "evicts with an allkeys-* policy. Unset: REDIS_URL.",
    )
    redis_max_connections: int = Field(
        default=64,
        ge=1,
        description="Connections in each Redis pool; an operation waits (within its own "
        "timeout) for a free one.",
    )
    redis_key_prefix: str = Field(
        default="sluicegate",
        min_length=1,
        description="Prefix of every Redis key the gateway writes (cache, locks, rate limits).",
    )
