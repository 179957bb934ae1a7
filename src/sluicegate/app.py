"""`create_app(settings)`: the FastAPI app, and the lifespan that owns the engine.

Importing this module starts nothing. The lifespan opens the engine in the running event
loop (vLLM requires it), hands it to requests through lifespan state, and shuts it down.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import redis.asyncio
from fastapi import FastAPI

from sluicegate import __version__
from sluicegate.admission import AdmissionMiddleware
from sluicegate.api import completions, health, models
from sluicegate.api.errors import install_error_handlers
from sluicegate.auth import ApiKeyMiddleware, ApiKeyring
from sluicegate.engine.protocol import EngineClient
from sluicegate.lifecycle import Lifecycle
from sluicegate.limits import BodyLimitMiddleware
from sluicegate.middleware import RequestIdMiddleware
from sluicegate.quota import Quotas
from sluicegate.ratelimit import MemoryRateLimiter, RateLimit, RateLimiter, RedisRateLimiter
from sluicegate.service import CompletionService, RequestLimits
from sluicegate.settings import Settings

logger = logging.getLogger(__name__)

EngineFactory = Callable[[Settings], Awaitable[EngineClient]]


def open_quotas(settings: Settings) -> Quotas:
    """Rate limits in Redis when a URL is set (shared by replicas), else in this process."""
    limiter: RateLimiter
    if settings.redis_url is not None:
        client = redis.asyncio.Redis.from_url(
            settings.redis_url.get_secret_value(),
            socket_connect_timeout=settings.rate_limit_redis_timeout,
            socket_timeout=settings.rate_limit_redis_timeout,
            retry_on_timeout=False,
        )
        limiter = RedisRateLimiter(client, op_timeout=settings.rate_limit_redis_timeout)
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


async def start_vllm_engine(settings: Settings) -> EngineClient:
    from sluicegate.engine.model import resolve_model
    from sluicegate.engine.vllm_engine import VLLMEngine

    return await VLLMEngine.start(settings, resolve_model(settings))


def create_app(
    settings: Settings,
    engine_factory: EngineFactory = start_vllm_engine,
    lifecycle: Lifecycle | None = None,
) -> FastAPI:
    """The app. `lifecycle` is shared with the server that drains it; tests may omit it."""
    lifecycle = lifecycle or Lifecycle(drain_timeout=settings.shutdown_timeout)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        async with AsyncExitStack() as stack:
            quotas = open_quotas(settings)
            stack.push_async_callback(quotas.limiter.close)
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
                    engine, settings.model_name, RequestLimits.from_settings(settings)
                ),
                "started_at": int(time.time()),
                "lifecycle": lifecycle,
                "quotas": quotas,
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
    # request id -> API key -> admission -> body limits -> routes.
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
    # Outermost, so even a 401 or 503 from the middleware above carries X-Request-Id.
    app.add_middleware(RequestIdMiddleware)
    return app
