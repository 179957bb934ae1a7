"""`create_app(settings)`: the FastAPI app, and the lifespan that owns the engine.

Importing this module starts nothing. The lifespan opens the engine in the running event
loop (vLLM requires it), hands it to requests through lifespan state, and shuts it down.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import redis.asyncio
from fastapi import FastAPI
from opentelemetry.sdk.trace import TracerProvider
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from sluicegate import __version__
from sluicegate.admission import AdmissionMiddleware
from sluicegate.api import completions, health, models
from sluicegate.api.errors import install_error_handlers
from sluicegate.auth import ApiKeyMiddleware, ApiKeyring
from sluicegate.budget import BudgetPolicy
from sluicegate.cache import CacheConfig, ResponseCache
from sluicegate.cache.fast_path import CacheHitMiddleware
from sluicegate.cache.store import CacheStore, MemoryStore, RedisStore
from sluicegate.cache.ttl import TtlPolicy, TtlRule
from sluicegate.engine.model import model_identity
from sluicegate.engine.protocol import EngineClient
from sluicegate.lifecycle import Lifecycle
from sluicegate.limits import BodyLimitMiddleware
from sluicegate.middleware import RequestIdMiddleware
from sluicegate.observability.middleware import TelemetryMiddleware
from sluicegate.observability.tracing import Tracing
from sluicegate.quota import Quotas
from sluicegate.ratelimit import MemoryRateLimiter, RateLimit, RateLimiter, RedisRateLimiter
from sluicegate.service import CompletionService, RequestLimits
from sluicegate.settings import Settings

logger = logging.getLogger(__name__)

EngineFactory = Callable[[Settings], Awaitable[EngineClient]]


def open_redis(settings: Settings) -> redis.asyncio.Redis | None:
    """One client (one connection pool) for everything the gateway keeps in Redis.

    Each user bounds its own operations with a timeout; the socket timeout is a backstop.
    One retry lets a request ride over a connection that died with a Redis restart."""
    if settings.redis_url is None:
        return None
    return redis.asyncio.Redis.from_url(
        settings.redis_url.get_secret_value(),
        socket_connect_timeout=1.0,
        socket_timeout=1.0,
        retry=Retry(NoBackoff(), 1),
    )


async def greet_redis(client: redis.asyncio.Redis, wait: float = 2.0) -> None:
    """Open the first connection at start-up (TLS and AUTH included, which can take longer
    than one operation's timeout) and say whether Redis answers. Start-up goes on either way:
    the cache and rate limits fail open until Redis is back."""
    kwargs = client.connection_pool.connection_kwargs
    where = kwargs.get("path") or f"{kwargs.get('host')}:{kwargs.get('port')}"
    try:
        async with asyncio.timeout(wait):
            await client.ping()
    except (TimeoutError, OSError, RedisError) as exc:
        logger.warning("redis at %s does not answer (%s): serving without it", where, exc)
    else:
        logger.info("redis at %s answers", where)


def open_quotas(settings: Settings, client: redis.asyncio.Redis | None) -> Quotas:
    """Rate limits in Redis when there is one (shared by replicas), else in this process."""
    limiter: RateLimiter
    if client is not None:
        limiter = RedisRateLimiter(
            client, prefix=settings.redis_key_prefix, op_timeout=settings.rate_limit_redis_timeout
        )
    else:
        limiter = MemoryRateLimiter()
    return Quotas(
        limiter,
        default=RateLimit(
            settings.rate_limit_requests_per_minute, settings.rate_limit_tokens_per_minute
        ),
        overrides={
            key: RateLimit(o.requests_per_minute, o.tokens_per_minute)
            for key, o in settings.rate_limit_overrides.items()
        },
    )


async def open_cache(settings: Settings, client: redis.asyncio.Redis | None) -> ResponseCache:
    """The response cache on Redis when there is one (shared by replicas), else in memory."""
    store: CacheStore = (
        MemoryStore(settings.cache_memory_max_bytes)
        if client is None
        else RedisStore(client, op_timeout=settings.cache_redis_timeout)
    )
    rule = TtlRule(
        base=settings.cache_ttl_seconds,
        minimum=settings.cache_ttl_min_seconds,
        maximum=settings.cache_ttl_max_seconds,
        fast_below=settings.cache_ttl_fast_latency,
        slow_above=settings.cache_ttl_slow_latency,
        fast_factor=settings.cache_ttl_fast_factor,
        slow_factor=settings.cache_ttl_slow_factor,
        jitter=settings.cache_ttl_jitter,
    )
    config = CacheConfig(
        policy=settings.cache_policy,
        prefix=settings.redis_key_prefix,
        per_key=settings.cache_per_api_key,
        max_entry_bytes=settings.cache_max_entry_bytes,
        flight_timeout=settings.cache_flight_timeout,
        retry_interval=settings.cache_retry_interval,
    )
    identity = await asyncio.to_thread(model_identity, settings)
    return ResponseCache(store, TtlPolicy(rule), config, settings.model_name, identity)


async def start_vllm_engine(settings: Settings) -> EngineClient:
    from sluicegate.engine.model import resolve_model
    from sluicegate.engine.vllm_engine import VLLMEngine

    return await VLLMEngine.start(settings, resolve_model(settings))


def create_app(
    settings: Settings,
    engine_factory: EngineFactory = start_vllm_engine,
    lifecycle: Lifecycle | None = None,
    tracer_provider: TracerProvider | None = None,
) -> FastAPI:
    """The app. `lifecycle` is shared with the server that drains it; tests may omit it.

    Traces go to `tracer_provider` when given, else where the `OTEL_*` environment says
    (nowhere when it says nothing)."""
    lifecycle = lifecycle or Lifecycle(drain_timeout=settings.shutdown_timeout)
    tracing = Tracing.from_env() if tracer_provider is None else Tracing(tracer_provider, False)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        async with AsyncExitStack() as stack:
            if tracing is not None:
                stack.enter_context(tracing.activate())
            client = open_redis(settings)
            if client is not None:
                stack.push_async_callback(client.aclose)
                await greet_redis(client)
            quotas = open_quotas(settings, client)
            stack.push_async_callback(quotas.limiter.close)
            cache = await open_cache(settings, client)
            stack.push_async_callback(cache.close)
            started = time.monotonic()
            engine = await engine_factory(settings)
            stack.push_async_callback(engine.shutdown)
            # Everything allocated so far (torch, transformers, the engine) lives until exit.
            # Freezing it keeps full garbage collections from walking it mid-stream, which
            # otherwise shows up as latency spikes under load.
            gc.collect()
            gc.freeze()
            logger.info(
                "engine ready in %.1f s: serving %s (max_model_len=%d)",
                time.monotonic() - started,
                settings.model_name,
                engine.max_model_len,
            )
            yield {
                "settings": settings,
                "engine": engine,
                "service": CompletionService(
                    engine,
                    settings.model_name,
                    RequestLimits.from_settings(settings),
                    BudgetPolicy.from_settings(settings),
                ),
                "started_at": int(time.time()),
                "lifecycle": lifecycle,
                "quotas": quotas,
                "cache": cache,
            }
            logger.info("shutting down the engine")

    app = FastAPI(
        title="sluicegate",
        version=__version__,
        description="OpenAI-compatible inference gateway over an in-process vLLM engine.",
        lifespan=lifespan,
    )
    install_error_handlers(app)
    app.include_router(completions.router)
    app.include_router(models.router)
    app.include_router(health.router)
    # Starlette runs the last-added middleware outermost, so requests pass, in order:
    # request id -> telemetry -> API key -> admission -> body limits -> cache hits -> routes.
    app.add_middleware(CacheHitMiddleware)
    app.add_middleware(
        BodyLimitMiddleware,
        max_bytes=settings.max_request_bytes,
        read_timeout=settings.request_body_timeout,
    )
    app.add_middleware(
        AdmissionMiddleware,
        lifecycle=lifecycle,
        max_in_flight=settings.max_in_flight,
        max_in_flight_per_key=settings.max_in_flight_per_key,
    )
    if settings.api_keys is not None:
        open_paths = {"/health", "/ready"} | (
            set() if settings.metrics_require_auth else {"/metrics"}
        )
        app.add_middleware(
            ApiKeyMiddleware,
            keyring=ApiKeyring.parse(settings.api_keys.get_secret_value()),
            open_paths=frozenset(open_paths),
        )
    # Outside the API key and admission checks, so their refusals are counted and logged.
    app.add_middleware(TelemetryMiddleware, model=settings.model_name, routes=app.router.routes)
    # Outermost, so even a 401 or 503 from the middleware above carries X-Request-Id.
    app.add_middleware(RequestIdMiddleware)
    if tracing is not None:
        tracing.instrument(app)
    return app
