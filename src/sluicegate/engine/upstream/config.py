"""What upstream mode is configured with (built from `Settings` in `wiring`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, slots=True)
class PoolConfig:
    """One upstream's connection pool and timeouts (httpx's `Limits` and `Timeout`)."""

    max_connections: int = 1024
    max_keepalive: int = 256
    keepalive_expiry: float = 30.0
    http2: bool = False
    transport: Literal["aiohttp", "httpcore"] = "aiohttp"
    """aiohttp's HTTP/1.1 client (C parser) under httpx's API, or httpx's own (httpcore),
    which HTTP/2 always uses (`transport.upstream_transport`)."""
    connect_timeout: float = 5.0
    read_timeout: float = 300.0
    write_timeout: float = 30.0
    pool_timeout: float = 5.0


@dataclass(frozen=True, slots=True)
class BreakerConfig:
    failures: int = 5
    """Consecutive failures that open the breaker."""
    error_ratio: float = 0.5
    """Share of failures over the last `window` outcomes that opens it."""
    window: int = 20
    open_seconds: float = 5.0
    """How long an open breaker refuses before it lets one trial request through."""


@dataclass(frozen=True, slots=True)
class RetryConfig:
    max_retries: int = 2
    backoff: float = 0.05
    """Base of the exponential backoff: try k waits uniform(0, min(max, backoff × 2^k))."""
    backoff_max: float = 2.0
    retry_after_max: float = 60.0
    """The longest `Retry-After` believed: a longer one is taken as this long."""
    budget: float = 0.2
    """Retries as a share of requests."""
    burst: int = 5
    """Retries the budget holds in reserve (and starts with): over any N requests, at most
    `burst + budget × N` retries. As many as `BreakerConfig.failures`, so an upstream going
    down fails no request before its breaker opens, however light the traffic."""


@dataclass(frozen=True, slots=True)
class AffinityConfig:
    chars: int = 256
    """Characters of the prompt's start that are hashed."""
    load_factor: float = 2.0
    """Bounded load: an upstream takes an affine request while its in-flight count stays
    within this factor of its weighted share of all in-flight requests."""


@dataclass(frozen=True, slots=True)
class UpstreamConfig:
    urls: tuple[tuple[str, float], ...]
    """Base URLs ending in /v1, each with its weight."""
    api_key: str | None = None
    pool: PoolConfig = PoolConfig()
    breaker: BreakerConfig = BreakerConfig()
    retry: RetryConfig = RetryConfig()
    affinity: AffinityConfig | None = None
    health_path: str = "/v1/models"
    health_interval: float = 5.0
    health_failures: int = 3
    """Probes in a row that must fail before an upstream is marked unhealthy."""
    start_timeout: float = 60.0
    """Seconds start-up waits for an upstream to list its models."""
    tokenizer: str | None = None
    """A local tokenizer (folder or hub id); None: the upstream's `/tokenize`, if any."""
    reasoning_parser: str | None = None
    """vLLM's reasoning parser that splits thoughts out of the upstream's content, with the
    local `tokenizer`; None: the upstream splits them itself, or they stay in the content."""
    reasoning_parser_plugin: str | None = None
    """A Python file registering more reasoning parsers with vLLM, loaded before the pool's."""
    served_model_name: str | None = None
    model: str | None = None
    """The model to ask the upstreams for; None: the first their `/v1/models` lists."""
    max_model_len: int = 2048
    """The context length when the upstream does not say (vLLM's `/v1/models` does)."""
    pass_through: bool = True
    """Plain streams hand on the upstream's chunks as they came (`wire.passthrough`)."""
    images: bool = True
    """The model reads images (a models-file entry's `images: false` says it does not)."""
    image_tokens: int = 1024
    """The tokens the budget counts for an image (an estimate: the upstream's usage says)."""
    forward_urls: bool = False
    """Images the gateway fetched go to the upstreams by the client's URL, not inline."""
